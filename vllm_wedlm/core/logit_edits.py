"""A request's own edits of every logits row before a token is chosen: allowed tokens, logit bias,
and the stop tokens that ``min_tokens`` holds back.

vLLM applies these to each next-token row of an AR request, in float32 (``allowed_token_ids``
removes every other token, ``logit_bias`` adds a constant to chosen tokens, ``min_tokens`` removes
the stop tokens while the output is shorter). A WeDLM window applies them to every row it
forwards, mask rows and a lossless window's next-token rows alike, each row at the output index of
the token it predicts (a mask row its own slot's, a next-token row the slot after it): a fill and
its entropy then come from the distribution AR would draw from at that position, and a lossless
window stays equal to AR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitEdits:
    """One request's edits: ``allowed`` token ids (None: every token), ``bias`` (token, value) pairs,
    and the ``stop_ids`` a row loses while the output index it predicts is below ``min_tokens``."""

    allowed: tuple[int, ...] | None = None
    bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0  # rows predicting an output index below it lose the stop tokens
    stop_ids: tuple[int, ...] = ()  # vLLM's all_stop_token_ids: EOS (unless ignored) and stop_token_ids

    @staticmethod
    def of(allowed_token_ids: Sequence[int] | None, logit_bias: dict[int, float] | None, min_tokens: int = 0,
           stop_ids: Sequence[int] = ()) -> LogitEdits | None:
        """The edits of vLLM's ``SamplingParams`` fields, or None when they change nothing."""
        holds_stops = bool(min_tokens and stop_ids)
        if not allowed_token_ids and not logit_bias and not holds_stops:
            return None
        return LogitEdits(allowed=tuple(allowed_token_ids) if allowed_token_ids else None,
                          bias=tuple((int(token), float(value)) for token, value in (logit_bias or {}).items()),
                          min_tokens=min_tokens if holds_stops else 0,
                          stop_ids=tuple(sorted(stop_ids)) if holds_stops else ())


def edit_logits(logits: torch.Tensor, row_edits: Sequence[LogitEdits | None],
                output_index: torch.Tensor | None = None) -> torch.Tensor:
    """[N, V] logits -> [N, V] float32 logits with each row's edits (``row_edits`` [N]) applied;
    ``output_index`` [N] int64 (on the logits' device): the output index of the token each row
    predicts, needed when an edit has ``min_tokens``.

    A float32 copy, as vLLM's sampler edits float32 logits: a bias added in bfloat16 would round
    differently and could move the argmax. Rows of one request share one ``LogitEdits`` object,
    so the work is one masked fill and one indexed add per request.
    """
    edited = logits.to(torch.float32, copy=True)
    groups: dict[int, tuple[LogitEdits, list[int]]] = {}
    for row, edits in enumerate(row_edits):
        if edits is not None:
            groups.setdefault(id(edits), (edits, []))[1].append(row)
    vocab, device = logits.shape[-1], logits.device
    for edits, rows in groups.values():
        index = torch.tensor(rows, dtype=torch.long, device=device)  # [n]
        if edits.allowed is not None:
            keep = torch.zeros(vocab, dtype=torch.bool, device=device)
            keep[torch.tensor(edits.allowed, dtype=torch.long, device=device)] = True
            edited[index] = edited[index].masked_fill(~keep, float("-inf"))
        if edits.bias:
            tokens = torch.tensor([token for token, _ in edits.bias], dtype=torch.long, device=device)  # [b]
            values = torch.tensor([value for _, value in edits.bias], dtype=torch.float32, device=device)  # [b]
            edited[index[:, None], tokens[None, :]] += values
        if edits.min_tokens:
            if output_index is None:
                raise ValueError("min_tokens needs each row's output index")
            stops = torch.tensor(edits.stop_ids, dtype=torch.long, device=device)  # [s]
            early = output_index[index] < edits.min_tokens  # [n]
            cells = (index[:, None], stops[None, :])
            edited[cells] = edited[cells].masked_fill(early[:, None], float("-inf"))
    return edited
