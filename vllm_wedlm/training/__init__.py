"""Training WeDLM models: dual-stream masking, WeDLM's loss, offline task data, recipes.

Needs only torch, transformers and tokenizers (no vLLM). See ``python -m vllm_wedlm.training -h``.
"""
