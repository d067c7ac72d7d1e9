"""The transformers config class for WeDLM checkpoints, and the facts of the published format.

Published WeDLM checkpoints point ``auto_map`` at remote code. Registering this class under
``"wedlm"`` lets transformers and vLLM load them with ``trust_remote_code`` off: a model type with
a local class is never resolved through ``auto_map``. One class covers both published bodies,
which differ only in two flags (``BODIES``).
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

#: ``model_type`` and ``architectures`` of a WeDLM config.json.
MODEL_TYPE = "wedlm"
ARCHITECTURE = "WeDLMForCausalLM"

#: The published config.json's ``auto_map``: remote code this package never runs, written into the
#: checkpoints it makes so that they have the published format.
AUTO_MAP = {
    "AutoConfig": "configuration_wedlm.WeDLMConfig",
    "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
}

#: The published bodies, by their base model's ``model_type``, and the flags that mark each in
#: config.json: WeDLM-7B has Qwen2.5's body (q/k/v biases, no q/k norm), WeDLM-8B Qwen3's (q/k
#: norm, no biases).
BODIES = {
    "qwen2": {"attention_bias": True, "qk_norm": False},
    "qwen3": {"attention_bias": False, "qk_norm": True},
}

#: The mask token id of the real WeDLM checkpoints. Their configs carry ``mask_token_id: null``
#: and WeDLM's own engine and trainer fall back to this id.
DEFAULT_MASK_TOKEN_ID = 151665


@strict
class WeDLMConfig(Qwen3Config):
    """Qwen2/Qwen3 hyper-parameters plus WeDLM's two extra fields.

    Legacy keys of the published ``config.json`` (``rope_theta``, ``rope_scaling: null``,
    ``torch_dtype``) are converted by transformers' own config machinery.
    """

    model_type = MODEL_TYPE

    # Qwen2-style configs carry no head_dim; it is then hidden_size // num_attention_heads.
    head_dim: int | None = None
    # Qwen3-style per-head RMSNorm of q and k before RoPE.
    qk_norm: bool = True
    # The id fed at undecided positions. None (the published value) means DEFAULT_MASK_TOKEN_ID.
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.mask_token_id is None:
            self.mask_token_id = DEFAULT_MASK_TOKEN_ID
        super().__post_init__(**kwargs)

    @property
    def body(self) -> str:
        """``"qwen2"`` or ``"qwen3"``: which published body these flags describe."""
        return body_of(self)


def body_of(config: object) -> str:
    """The published body (a key of ``BODIES``) of any config object with WeDLM's two flags."""
    flags = {name: bool(getattr(config, name, False)) for name in BODIES["qwen3"]}
    for body, body_flags in BODIES.items():
        if flags == body_flags:
            return body
    raise ValueError(
        f"WeDLM config has {_flags(flags)}; a WeDLM model is either "
        + " or ".join(f"{body}-style ({_flags(body_flags)})" for body, body_flags in BODIES.items())
        + "."
    )


def _flags(flags: dict[str, bool]) -> str:
    return ", ".join(f"{name}={value}" for name, value in flags.items())


__all__ = ["ARCHITECTURE", "AUTO_MAP", "BODIES", "DEFAULT_MASK_TOKEN_ID", "MODEL_TYPE", "WeDLMConfig", "body_of"]
