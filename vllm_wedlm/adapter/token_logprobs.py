"""Log-probs of the tokens a WeDLM step returns, for requests that ask for ``logprobs``.

A returned token's log-probs come from the row it was drawn from, as vLLM's sampler gives them for
AR: the raw logits' log-softmax (vLLM's default ``raw_logprobs`` mode), the token's own entry, its
rank and the top K. A lossless request's tokens are all drawn from AR rows, so its log-probs are
AR's: its window's slot 0 from the row after its last committed token (drawn one step before it is
returned, so kept per table slot until then), each accepted fill from the verification row before
it. An AR-decoded request's token comes from its last row in the step that returns it. A plain
window's token comes from the mask row that filled its slot, possibly steps before the token is
returned (a fill is never revised): every mask row's entry is written, when forwarded, to its
request's ring of fills at its absolute position (position mod C, the table's window capacity: a
window's slots are C consecutive positions at most, so they never share a ring entry); a mask
that stays open is written again by its next forward, a filled one is not forwarded as a mask
again, so the ring holds the filling row's entry when the run returns it.

A request that asks for the log-probs of chosen token ids (vLLM's ``logprob_token_ids``) gets, in
each of its rows' entries, those ids after the token, in order, then padding (token 0, -inf), as
vLLM's sampler gives them; the entries widen to the longest such list.

Every returned cell ([B, width], -1 where no token) reads one entry of a bank: this step's rows
first (N of them), then the kept slot-0 entries (one per table slot), then the rings (C per table
slot); vLLM drops the entries of empty cells as it drops the cells.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.sampler import Sampler


class TokenLogprobs:
    def __init__(self, max_logprobs: int, device: torch.device):
        # Top K of every entry: the most a request may ask for (vLLM's max_logprobs; -1: no limit),
        # each request keeping its own number of them.
        self.k = max_logprobs if max_logprobs >= 0 else sys.maxsize
        self.device = device
        self.kept: LogprobsTensors | None = None  # [S, K + 1] per table slot: its window's slot-0 token
        self.fills: LogprobsTensors | None = None  # [S * C, K + 1]: each table slot's ring of fills

    def entries(self, raw_logits: torch.Tensor, tokens: torch.Tensor,
                chosen: list[tuple[int, ...] | None] | None = None) -> LogprobsTensors:
        """[n, K + 1] entries of rows ([n, V] raw logits), each for its token ([n]; a negative one,
        an empty cell's, reads token 0). ``chosen``: per row, the token ids its request asks the
        log-probs of (``logprob_token_ids``), or None (the top K)."""
        asked = [] if chosen is None else [(row, ids) for row, ids in enumerate(chosen) if ids]
        if asked:
            self.k = max(self.k, max(len(ids) for _, ids in asked))
        if not raw_logits.shape[0]:  # vLLM's compiled rank count takes no empty batch
            return self.no_entries(raw_logits.shape[-1])
        logprobs = Sampler.compute_logprobs(raw_logits)
        entries = Sampler.gather_logprobs(logprobs, min(self.k, logprobs.shape[-1]), tokens.long().clamp(min=0))
        if asked:
            width = entries.logprobs.shape[1] - 1
            ids = np.zeros((len(asked), width), np.int64)
            valid = np.zeros((len(asked), width), bool)
            for i, (_, row_ids) in enumerate(asked):
                ids[i, : len(row_ids)], valid[i, : len(row_ids)] = row_ids, True
            rows = torch.tensor([row for row, _ in asked], device=self.device)
            ids_dev = torch.from_numpy(ids).to(self.device, non_blocking=True)  # [m, K]
            valid_dev = torch.from_numpy(valid).to(self.device, non_blocking=True)
            entries.logprob_token_ids[rows, 1:] = ids_dev.to(entries.logprob_token_ids.dtype)
            entries.logprobs[rows, 1:] = logprobs[rows].gather(1, ids_dev).masked_fill(~valid_dev, float("-inf"))
        return entries

    def no_entries(self, vocab_size: int) -> LogprobsTensors:
        """No rows, in the width ``entries`` gives rows of ``vocab_size`` logits."""
        return _at_least(None, 0, min(self.k, vocab_size) + 1, self.device)

    def bank(self, rows: LogprobsTensors, slots: int, capacity: int = 0) -> LogprobsTensors:
        """The step's rows, then the kept entries of ``slots`` table slots, then their rings of fills
        (``capacity`` each; 0 while no plain window asks)."""
        width = rows.logprobs.shape[1]
        self.kept = _at_least(self.kept, slots, width, self.device)
        parts = [rows, self.kept]
        if capacity:
            self.fills = _at_least(self.fills, slots * capacity, width, self.device)
            parts.append(self.fills)
        return LogprobsTensors(torch.cat([p.logprob_token_ids for p in parts]), torch.cat([p.logprobs for p in parts]),
                               torch.cat([p.selected_token_ranks.long() for p in parts]))

    def write_fills(self, rows: LogprobsTensors, source: torch.Tensor, ring: torch.Tensor, slots: int,
                    capacity: int) -> None:
        """Write the entries ``source`` ([m]) of ``rows`` (this step's mask rows' entries) to the ring
        entries ``ring`` ([m]: table slot * capacity + absolute position mod capacity; ``slots *
        capacity``, one past the rings, takes writes that go nowhere, so a device-side choice needs no
        host sync), before ``bank`` copies the rings for the cells to read."""
        self.fills = _at_least(self.fills, slots * capacity + 1, rows.logprobs.shape[1], self.device)
        self.fills.logprob_token_ids[ring] = rows.logprob_token_ids[source].long()
        self.fills.logprobs[ring] = rows.logprobs[source]
        self.fills.selected_token_ranks[ring] = rows.selected_token_ranks[source].long()

    @staticmethod
    def cells(bank: LogprobsTensors, source: torch.Tensor) -> LogprobsTensors:
        """The entries of the returned cells: ``source`` [B, width] int64, each cell's bank entry."""
        flat = source.flatten()
        return LogprobsTensors(bank.logprob_token_ids[flat], bank.logprobs[flat], bank.selected_token_ranks[flat])

    def keep(self, bank: LogprobsTensors, slots: torch.Tensor, source: torch.Tensor) -> None:
        """Keep bank entries ``source`` ([m]) for table ``slots`` ([m]), after ``cells`` read the old ones."""
        self.kept.logprob_token_ids[slots] = bank.logprob_token_ids[source]
        self.kept.logprobs[slots] = bank.logprobs[source]
        self.kept.selected_token_ranks[slots] = bank.selected_token_ranks[source]


def _at_least(entries: LogprobsTensors | None, count: int, width: int, device: torch.device) -> LogprobsTensors:
    """``entries`` grown to ``count`` rows of ``width`` entries (zeros after the old ones, in both
    directions), or as they are."""
    if entries is not None and entries.logprobs.shape[0] >= count and entries.logprobs.shape[1] >= width:
        return entries
    if entries is not None:
        count, width = max(count, entries.logprobs.shape[0]), max(width, entries.logprobs.shape[1])
    grown = LogprobsTensors(torch.zeros(count, width, dtype=torch.long, device=device),
                            torch.zeros(count, width, dtype=torch.float32, device=device),
                            torch.zeros(count, dtype=torch.long, device=device))
    if entries is not None:
        old, old_width = entries.logprobs.shape
        grown.logprob_token_ids[:old, :old_width] = entries.logprob_token_ids
        grown.logprobs[:old, :old_width] = entries.logprobs
        grown.selected_token_ranks[:old] = entries.selected_token_ranks
    return grown
