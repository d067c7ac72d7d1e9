"""vLLM's per-architecture config hook for ``WeDLMForCausalLM`` (``MODELS_CONFIG_MAP``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.model_executor.models.config import VerifyAndUpdateConfig

from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.models.configuration_wedlm import body_of

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class WeDLMConfigHook(VerifyAndUpdateConfig):
    """Runs inside ``VllmConfig.__post_init__``: bad settings fail before any weight is loaded."""

    @staticmethod
    def verify_and_update_config(vllm_config: VllmConfig) -> None:
        WeDLMSettings.from_additional_config(vllm_config.additional_config)
        body_of(vllm_config.model_config.hf_config)
