"""The plugin's user-facing settings, carried in vLLM's ``additional_config``.

``vllm serve MODEL --decoding ar`` and ``LLM(MODEL, additional_config={"decoding": "ar"})`` both
end up here. Keeping the settings in ``additional_config`` puts them in vLLM's config hash and
ships them to every engine process without any side channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Decoding modes this version can run. "ar" is plain autoregressive decoding of the same weights.
DECODING_MODES = ("ar",)
DEFAULT_DECODING = "ar"

#: The additional_config key of each setting.
DECODING_KEY = "decoding"


@dataclass(frozen=True)
class WeDLMSettings:
    """Validated plugin settings of one engine."""

    decoding: str = DEFAULT_DECODING
    """How to decode: ``"ar"`` (one token per forward, vLLM's ordinary path)."""

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> WeDLMSettings:
        """Read and validate the settings; raise ``ValueError`` with the fix on bad input."""
        if not isinstance(additional_config, dict):
            return cls()
        decoding = additional_config.get(DECODING_KEY, DEFAULT_DECODING)
        if decoding not in DECODING_MODES:
            raise ValueError(
                f"Unknown decoding mode {decoding!r} (additional_config[{DECODING_KEY!r}]); "
                f"choose one of {', '.join(DECODING_MODES)}."
            )
        return cls(decoding=decoding)
