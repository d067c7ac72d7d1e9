"""WeDLM's per-request decoding knobs, validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeDLMParams:
    """How one request chooses which masks to fill each step.

    Defaults are WeDLM's own (wedlm_entropy_threshold 0.4, wedlm_pos_penalty_factor 0.02).
    """

    entropy_threshold: float | None = 0.4
    """tau: fill every mask whose adjusted entropy (nats) is strictly below it; at least one mask
    (the lowest) is filled each step. None fills exactly one mask per step."""

    pos_penalty: float = 0.02
    """lambda: adjusted entropy = entropy + lambda * (slot index - index of the first mask).
    Larger values decode more left to right."""

    lossless: bool = False
    """Verify every fill against the model's next-token (AR) prediction before committing it
    (``sampling.verify``, ``batch.verify_windows``): the output is exactly what ``--decoding ar``
    gives on the same weights, greedy token for token, sampled in distribution."""

    def __post_init__(self):
        tau = self.entropy_threshold
        if tau is not None and (not isinstance(tau, (int, float)) or isinstance(tau, bool) or not tau > 0
                                or not math.isfinite(tau)):
            raise ValueError(f"entropy_threshold must be a positive finite number or None, got {tau!r}")
        lam = self.pos_penalty
        if not isinstance(lam, (int, float)) or isinstance(lam, bool) or not (lam >= 0 and math.isfinite(lam)):
            raise ValueError(f"pos_penalty must be a finite number >= 0, got {lam!r}")
        if not isinstance(self.lossless, bool):
            raise ValueError(f"lossless must be true or false, got {self.lossless!r}")


DEFAULT_PARAMS = WeDLMParams()

#: WeDLM's default window: the number of undecided slots kept per request.
DEFAULT_WINDOW_SIZE = 16


def validate_window_size(window_size: object) -> int:
    if not isinstance(window_size, int) or isinstance(window_size, bool) or not 1 <= window_size <= 256:
        raise ValueError(f"window_size must be an integer in [1, 256], got {window_size!r}")
    return window_size


def validate_window_tokens(window_tokens: object) -> int:
    if not isinstance(window_tokens, int) or isinstance(window_tokens, bool) or not 1 <= window_tokens <= 1 << 20:
        raise ValueError(f"window_tokens must be an integer in [1, {1 << 20}], got {window_tokens!r}")
    return window_tokens


def selection_values(params: WeDLMParams) -> tuple[float, float]:
    """One request's entropy threshold (-inf for None: nothing is below it, so the lowest mask is
    filled alone) and position penalty, as ``batch.finish_windows`` reads them."""
    return float("-inf") if params.entropy_threshold is None else params.entropy_threshold, params.pos_penalty


def selection_tensors(params: list[WeDLMParams],
                      device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[B] float32 entropy thresholds and [B] float32 position penalties of ``params``
    (``selection_values``), for ``batch.finish_windows``."""
    tau, lam = zip(*map(selection_values, params), strict=True) if params else ((), ())
    return (torch.tensor(tau, dtype=torch.float32, device=device),
            torch.tensor(lam, dtype=torch.float32, device=device))
