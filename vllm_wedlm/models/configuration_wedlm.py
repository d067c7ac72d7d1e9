"""The transformers config class for WeDLM checkpoints (``model_type: "wedlm"``).

Published WeDLM checkpoints point ``auto_map`` at remote code. Registering this class under
``"wedlm"`` lets transformers and vLLM load them with ``trust_remote_code`` off: a model type with
a local class is never resolved through ``auto_map``.

One class covers both published bodies, which differ only in two flags:

* WeDLM-7B (Qwen2.5 body): ``attention_bias=True``, ``qk_norm=False``;
* WeDLM-8B (Qwen3 body): ``attention_bias=False``, ``qk_norm=True``.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config

#: The mask token id of the real WeDLM checkpoints. Their configs carry ``mask_token_id: null``
#: and WeDLM's own engine and trainer fall back to this id.
DEFAULT_MASK_TOKEN_ID = 151665

#: The (attention_bias, qk_norm) pairs that a published WeDLM body uses.
SUPPORTED_BODIES = {(True, False): "Qwen2", (False, True): "Qwen3"}


@strict
class WeDLMConfig(Qwen3Config):
    """Qwen2/Qwen3 hyper-parameters plus WeDLM's two extra fields.

    Legacy keys of the published ``config.json`` (``rope_theta``, ``rope_scaling: null``,
    ``torch_dtype``) are converted by transformers' own config machinery.
    """

    model_type = "wedlm"

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
        """``"Qwen2"`` or ``"Qwen3"``: which published architecture these flags describe."""
        return body_of(self)


def body_of(config) -> str:
    """``"Qwen2"`` or ``"Qwen3"`` for any config object with WeDLM's two flags."""
    bias, qk_norm = bool(getattr(config, "attention_bias", False)), bool(getattr(config, "qk_norm", False))
    if (bias, qk_norm) not in SUPPORTED_BODIES:
        raise ValueError(
            f"WeDLM config has attention_bias={bias} and qk_norm={qk_norm}; a WeDLM model is either "
            "Qwen2-style (attention_bias=true, qk_norm=false) or Qwen3-style (attention_bias=false, "
            "qk_norm=true)."
        )
    return SUPPORTED_BODIES[(bias, qk_norm)]


__all__ = ["DEFAULT_MASK_TOKEN_ID", "WeDLMConfig", "body_of"]
