"""What the ``vllm.general_plugins`` entry point does, in every vLLM process.

vLLM starts its engine core and workers with ``spawn``, so nothing done in the user's process
reaches them: each registration here runs again in each process, and must be cheap, idempotent
and free of CUDA initialisation. The model class is registered by its qualified name, so the
module that imports vLLM's model code is loaded only where the model is built.
"""

from __future__ import annotations

from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, MODEL_TYPE

MODEL_CLASS = "vllm_wedlm.models.wedlm:WeDLMForCausalLM"

_done = False


def register_all() -> None:
    global _done
    if _done:
        return
    if not has_v1_model_runner():  # vLLM 0.34 and later: Model Runner V2 only
        from vllm_wedlm.v2.registration import register

        register()
        _done = True
        return
    register_config_class()
    register_model()
    register_config_hook()

    from vllm_wedlm.cli import install_cli_flags

    install_cli_flags()
    _done = True


def has_v1_model_runner() -> bool:
    """Whether the installed vLLM has the V1 model runner the adapter overrides (vLLM 0.26.0, the
    pinned one); vLLM 0.34 removed it, and the plugin then registers its V2 binding (``vllm_wedlm.v2``,
    not served yet: docs/vllm-upgrade.md). Looked up without importing it."""
    import importlib.util

    return importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None


def register_config_class() -> None:
    """Make ``model_type: "wedlm"`` a local config type for transformers and vLLM."""
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    from vllm_wedlm.models.auto import register_with_transformers
    from vllm_wedlm.models.configuration_wedlm import WeDLMConfig

    register_with_transformers()  # done by `import vllm_wedlm` already; idempotent
    # vLLM's own table: a type found here is parsed with trust_remote_code off, whatever
    # `auto_map` the checkpoint carries.
    _CONFIG_REGISTRY[MODEL_TYPE] = WeDLMConfig


def register_model() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def register_config_hook() -> None:
    """vLLM's per-architecture config hook: validates the decoding settings at start-up."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from vllm_wedlm.adapter.config_hook import WeDLMConfigHook

    MODELS_CONFIG_MAP.setdefault(ARCHITECTURE, WeDLMConfigHook)
