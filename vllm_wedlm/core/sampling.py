"""Drawing a token for each mask row (wedlm.md 2.5).

Order, as in WeDLM: top-k on the raw logits, then top-p on their softmax, then temperature, then
one draw per row. Temperature 0 is greedy (top-k/top-p do not matter then). The mask token itself
is never drawn: committing it would put the placeholder into the text (WeDLM's engine does not
ban it; a trained model almost never picks it, an untrained one may). Except for a request
decoded autoregressively on a WeDLM engine (``ban_mask_token`` False): it draws from the whole
vocabulary, as vLLM's own sampler does in ``--decoding ar``, so that greedy output is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling settings (vLLM's conventions: top_k 0 or -1 and top_p 1 mean off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None  # seeded requests; on the logits' device
    ban_mask_token: bool = True  # False for AR-decoded requests (next-token rows, not mask rows)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_rows(logits: torch.Tensor, specs: list[SamplingSpec], rows_per_spec: list[int],
                mask_id: int) -> torch.Tensor:
    """[N, V] logits, rows grouped by request (``rows_per_spec``) -> [N] int64 tokens."""
    logits = logits.float().clone()
    banned = torch.tensor([spec.ban_mask_token for spec, count in zip(specs, rows_per_spec, strict=True)
                           for _ in range(count)], dtype=torch.bool, device=logits.device)  # [N]
    logits[:, mask_id] = logits[:, mask_id].masked_fill(banned, float("-inf"))
    out = torch.argmax(logits, dim=-1)
    start = 0
    for spec, count in zip(specs, rows_per_spec, strict=True):
        if count and not spec.greedy:
            out[start:start + count] = _draw(logits[start:start + count], spec)
        start += count
    return out


def _draw(logits: torch.Tensor, spec: SamplingSpec) -> torch.Tensor:
    """[n, V] -> [n] tokens for one non-greedy request."""
    if spec.top_k > 0 and spec.top_k < logits.shape[-1]:
        kth = torch.topk(logits, spec.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if spec.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already exceeds top_p; the top one always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) > spec.top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits / spec.temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=spec.generator).flatten()
