"""``WeDLMForCausalLM`` on the V2 runner: vLLM's Qwen2 / Qwen3 causal LM of the checkpoint's body,
whose instances name their model state (the V2 runner asks the model for it)."""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from vllm_wedlm.models.configuration_wedlm import body_of


class _WeDLMState:
    @staticmethod
    def get_model_state_cls() -> type:
        from vllm_wedlm.v2.model_state import WeDLMModelState

        return WeDLMModelState


class WeDLMQwen2ForCausalLM(_WeDLMState, Qwen2ForCausalLM):
    pass


class WeDLMQwen3ForCausalLM(_WeDLMState, Qwen3ForCausalLM):
    pass


_BODIES = {"qwen2": WeDLMQwen2ForCausalLM, "qwen3": WeDLMQwen3ForCausalLM}


class WeDLMForCausalLM(WeDLMQwen3ForCausalLM):
    """The class registered for the architecture: it builds the model of the config's body (an
    instance of that class, so Python runs its ``__init__``, never this class's)."""

    def __new__(cls, *, vllm_config: VllmConfig, prefix: str = ""):
        return _BODIES[body_of(vllm_config.model_config.hf_config)](vllm_config=vllm_config, prefix=prefix)
