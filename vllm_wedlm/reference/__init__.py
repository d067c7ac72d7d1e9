"""A plain PyTorch WeDLM decoder over a transformers model: the oracle for the vLLM adapter."""

from vllm_wedlm.reference.decoder import ReferenceDecoder, ReferenceOutput, StopRule

__all__ = ["ReferenceDecoder", "ReferenceOutput", "StopRule"]
