"""Which masks to fill: entropy of each mask's own logits plus a distance penalty (wedlm.md 2.4.7)."""

from __future__ import annotations

import torch

from vllm_wedlm.core.params import WeDLMParams


def row_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] logits -> [N] float32 entropy in nats of each row's softmax.

    Computed in float32 whatever the logits dtype (WeDLM's engine uses the logits dtype; in
    bfloat16 the entropy is too coarse to compare with a threshold reliably). With y = x - max(x),
    S = sum(e^y) and T = sum(e^y * y), the entropy is log S - T / S: after the max, one pass over
    the row gives both sums (compiled, two reads of the logits; the log-softmax form takes three,
    lab notebook 5.10).
    """
    shifted = logits.float()
    shifted = shifted - shifted.amax(dim=-1, keepdim=True)  # [N, V], <= 0
    weights = shifted.exp()
    total = weights.sum(dim=-1)  # [N], >= 1
    # e^y * y is 0 * -inf = nan for masked-out (-inf) logits; they contribute 0.
    return total.log() - (weights * shifted.nan_to_num(neginf=0.0)).sum(dim=-1) / total


def choose_fills(entropy: torch.Tensor, mask_slots: torch.Tensor, params: WeDLMParams) -> torch.Tensor:
    """[m] entropies of one request's masks, [m] their slot indices -> [m] bool, which to fill.

    Adjusted entropy = entropy + lambda * (slot - first mask slot). Every mask strictly below the
    threshold is filled; if none is (or the threshold is None) the single lowest is (first one
    on ties).
    """
    if entropy.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    distance = (mask_slots - mask_slots[0]).to(torch.float32)
    adjusted = entropy.to(torch.float32) + params.pos_penalty * distance
    chosen = torch.zeros_like(adjusted, dtype=torch.bool)
    if params.entropy_threshold is not None:
        chosen = adjusted < params.entropy_threshold
    if not bool(chosen.any()):
        chosen[torch.argmin(adjusted)] = True
    return chosen
