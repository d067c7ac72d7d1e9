"""What the plugin registers with vLLM 0.34 for the V2 binding: WeDLM's config type and its model.

The plugin's entry point (``vllm_wedlm.plugin.register_all``) calls ``register`` where vLLM has no V1
model runner. (On vLLM 0.26 it also installs the V1 adapter's config hook and command line flags;
their V2 forms come with the next slices.)
"""

from __future__ import annotations

from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, MODEL_TYPE

MODEL_CLASS = "vllm_wedlm.v2.model:WeDLMForCausalLM"


def register() -> None:
    """Idempotent; imports no model code (the model class is registered by name)."""
    from vllm import ModelRegistry
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    from vllm_wedlm.models.auto import register_with_transformers
    from vllm_wedlm.models.configuration_wedlm import WeDLMConfig

    register_with_transformers()
    _CONFIG_REGISTRY[MODEL_TYPE] = WeDLMConfig
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
