"""The plugin's user-facing settings, carried in vLLM's ``additional_config``.

``vllm serve MODEL --decoding wedlm --wedlm-window-size 16`` and
``LLM(MODEL, additional_config={"decoding": "wedlm", "window_size": 16})`` both end up here.
Keeping the settings in ``additional_config`` puts them in vLLM's config hash and ships them to
every engine process without any side channel. Per-request overrides of the two selection knobs
come through ``SamplingParams.extra_args`` (OpenAI: ``vllm_xargs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_wedlm.core.params import DEFAULT_PARAMS, DEFAULT_WINDOW_SIZE, WeDLMParams, validate_window_size

#: Decoding modes. "ar": one token per forward, vLLM's ordinary path. "wedlm": WeDLM's streaming
#: parallel decoding of a window of masked slots per forward.
DECODING_MODES = ("ar", "wedlm")
DEFAULT_DECODING = "ar"

#: additional_config keys (server-wide settings).
DECODING_KEY = "decoding"
WINDOW_SIZE_KEY = "window_size"
ENTROPY_THRESHOLD_KEY = "entropy_threshold"
POS_PENALTY_KEY = "pos_penalty"

#: SamplingParams.extra_args keys (per-request overrides); prefixed, as extra_args is shared.
REQUEST_ENTROPY_THRESHOLD = "wedlm_entropy_threshold"
REQUEST_POS_PENALTY = "wedlm_pos_penalty"


@dataclass(frozen=True)
class WeDLMSettings:
    """Validated plugin settings of one engine."""

    decoding: str = DEFAULT_DECODING
    """How to decode: "ar" or "wedlm"."""

    window_size: int = DEFAULT_WINDOW_SIZE
    """W: undecided slots kept per request (WeDLM mode); each forward covers W to 2W tokens."""

    params: WeDLMParams = field(default_factory=lambda: DEFAULT_PARAMS)
    """Server default of the selection knobs (tau, lambda)."""

    @property
    def wedlm(self) -> bool:
        return self.decoding == "wedlm"

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> WeDLMSettings:
        """Read and validate the settings; raise ``ValueError`` saying what to fix."""
        if not isinstance(additional_config, dict):
            return cls()
        decoding = additional_config.get(DECODING_KEY, DEFAULT_DECODING)
        if decoding not in DECODING_MODES:
            raise ValueError(
                f"Unknown decoding mode {decoding!r} (additional_config[{DECODING_KEY!r}]); "
                f"choose one of {', '.join(DECODING_MODES)}."
            )
        window_size = validate_window_size(additional_config.get(WINDOW_SIZE_KEY, DEFAULT_WINDOW_SIZE))
        params = WeDLMParams(
            entropy_threshold=additional_config.get(ENTROPY_THRESHOLD_KEY, DEFAULT_PARAMS.entropy_threshold),
            pos_penalty=additional_config.get(POS_PENALTY_KEY, DEFAULT_PARAMS.pos_penalty),
        )
        return cls(decoding=decoding, window_size=window_size, params=params)

    def request_params(self, extra_args: dict | None) -> WeDLMParams:
        """The selection knobs of one request: its extra_args over the server defaults."""
        if not extra_args:
            return self.params
        return WeDLMParams(
            entropy_threshold=extra_args.get(REQUEST_ENTROPY_THRESHOLD, self.params.entropy_threshold),
            pos_penalty=extra_args.get(REQUEST_POS_PENALTY, self.params.pos_penalty),
        )
