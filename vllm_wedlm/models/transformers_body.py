"""A WeDLM checkpoint as a plain transformers Qwen2/Qwen3 causal LM.

The weights of a WeDLM model are those of its base Qwen model (research/wedlm.md 1.2), so
transformers' own ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` run it exactly. The reference
decoder, the tests, the checkpoint factory and ``AutoModelForCausalLM`` (models/auto.py) use
this; vLLM does not.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from vllm_wedlm.models.configuration_wedlm import BODIES, WeDLMConfig

_CLASSES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
# Fields of a WeDLMConfig that are not the Qwen config's: WeDLM's and the checkpoint's own. The body
# flags (BODIES) are left out too: they are what the Qwen class of that body builds by default.
_WEDLM_ONLY = ("mask_token_id", "auto_map", "model_type", "architectures", "transformers_version")


def qwen_config_for(config: WeDLMConfig) -> Qwen2Config | Qwen3Config:
    """The Qwen2Config / Qwen3Config with the same hyper-parameters as a WeDLM config."""
    config_cls, _ = _CLASSES[config.body]
    fields = {k: v for k, v in config.to_dict().items() if k not in _WEDLM_ONLY and k not in BODIES[config.body]}
    if config.body == "qwen2":
        fields.pop("head_dim", None)  # Qwen2 derives it from hidden_size / num_attention_heads
    return config_cls(**fields)


def qwen_model_class(config: WeDLMConfig) -> type[PreTrainedModel]:
    """``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM``: the transformers class of a WeDLM config's body."""
    return _CLASSES[config.body][1]


def model_for(config: WeDLMConfig) -> PreTrainedModel:
    """A randomly initialised transformers model with this WeDLM config's shapes."""
    return qwen_model_class(config)(qwen_config_for(config))


def load_transformers_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load a WeDLM checkpoint directory into transformers' Qwen2/Qwen3 causal LM, in eval mode."""
    config = WeDLMConfig.from_pretrained(path)
    model = qwen_model_class(config).from_pretrained(path, config=qwen_config_for(config), dtype=dtype)
    return model.eval()
