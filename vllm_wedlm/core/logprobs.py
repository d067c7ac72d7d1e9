"""The log-prob entries of drawn tokens, in the form vLLM reports them for AR decoding.

An entry of a logits row is what vLLM's sampler returns for the token it drew there: the row's
log-softmax in float32, the token's own log-prob and rank (1 + how many tokens are likelier; a tie
counts as likelier), then the K likeliest tokens and their log-probs, the token first. Written here
so that every binding computes the same entries (vLLM 0.26's sampler and 0.34's compute them in
their own ways).
"""

from __future__ import annotations

import torch


def row_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """[n, V] float32: each row's log-softmax (vLLM's default ``raw_logprobs``: before any edit)."""
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def token_entries(logprobs: torch.Tensor, k: int,
                  tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's entry for its token ([n] int64): ([n, k + 1] int32 ids, [n, k + 1] float32
    log-probs, the token first, then the top ``k``; [n] int64 the token's rank)."""
    top_values, top_ids = torch.topk(logprobs, k, dim=-1)  # [n, k]
    token = tokens[:, None]  # [n, 1]
    token_values = logprobs.gather(-1, token)  # [n, 1]
    ranks = (logprobs >= token_values).sum(-1)  # [n]: the token counts itself, so the likeliest is 1
    return (torch.cat([token, top_ids], dim=1).to(torch.int32), torch.cat([token_values, top_values], dim=1),
            ranks)
