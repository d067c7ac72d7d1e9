"""vllm_wedlm: WeDLM models and WeDLM decoding as a plugin of stock vLLM.

Importing this package imports neither vLLM nor torch. vLLM calls :func:`register` (the
``vllm.general_plugins`` entry point ``wedlm``) in every process it starts.
"""

__version__ = "0.1.0"


def register() -> None:
    """Register WeDLM with vLLM and transformers; idempotent, imports no CUDA."""
    from vllm_wedlm.plugin import register_all

    register_all()


__all__ = ["__version__", "register"]
