"""vllm_wedlm: WeDLM models and WeDLM decoding as a plugin of stock vLLM.

vLLM calls :func:`register` (the ``vllm.general_plugins`` entry point ``wedlm``) in every process
it starts. Importing this package registers WeDLM's classes with transformers' Auto classes
(``models/auto.py``), so that ``AutoConfig``, ``AutoTokenizer`` and ``AutoModelForCausalLM`` load
WeDLM checkpoints with ``trust_remote_code`` off, as vLLM does. That imports transformers (and
torch, which transformers' config machinery imports); it imports no vLLM and initialises no CUDA.
"""

from vllm_wedlm.models.auto import register_with_transformers

__version__ = "0.1.0"

register_with_transformers()


def register() -> None:
    """Register WeDLM with vLLM and transformers; idempotent, imports no CUDA."""
    from vllm_wedlm.plugin import register_all

    register_all()


__all__ = ["__version__", "register", "register_with_transformers"]
