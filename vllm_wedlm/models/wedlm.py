"""``WeDLMForCausalLM`` for vLLM: vLLM's own Qwen2 or Qwen3 causal LM, chosen by the config's flags.

A WeDLM checkpoint has exactly the tensors of its base Qwen model (research/wedlm.md 1.2): no extra
heads, the mask token is an ordinary embedding row. So the model vLLM builds for it is vLLM's
``Qwen2ForCausalLM`` (WeDLM-7B) or ``Qwen3ForCausalLM`` (WeDLM-8B), unchanged: constructor,
forward, logits and weight loading all come from vLLM and follow its releases.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from vllm_wedlm.models.configuration_wedlm import body_of

_VLLM_CLASSES: dict[str, type[Qwen2ForCausalLM | Qwen3ForCausalLM]] = {
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}


class WeDLMForCausalLM(Qwen3ForCausalLM):
    """The class registered for the architecture ``WeDLMForCausalLM``.

    vLLM reads what the model supports (pipeline parallelism, LoRA, ...) from the registered class;
    vLLM's Qwen2 and Qwen3 classes support the same. It builds the model by calling the class,
    which returns vLLM's model of the checkpoint's body (an instance of that class, so Python runs
    its ``__init__`` and never this class's).
    """

    def __new__(cls, *, vllm_config: VllmConfig, prefix: str = "") -> Qwen2ForCausalLM | Qwen3ForCausalLM:
        body_cls = _VLLM_CLASSES[body_of(vllm_config.model_config.hf_config)]
        return body_cls(vllm_config=vllm_config, prefix=prefix)
