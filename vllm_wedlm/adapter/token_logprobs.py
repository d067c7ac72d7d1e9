"""Log-probs of the tokens a WeDLM step returns, for requests that ask for ``logprobs``.

A returned token's log-probs come from the row it was drawn from, as vLLM's sampler gives them for
AR: the raw logits' log-softmax (vLLM's default ``raw_logprobs`` mode), the token's own entry, its
rank and the top K. A lossless request's tokens are all drawn from AR rows, so its log-probs are
AR's: its window's slot 0 from the row after its last committed token (drawn one step before it is
returned, so kept per table slot until then), each accepted fill from the verification row before
it. An AR-decoded request's token comes from its last row in the step that returns it. A plain
window's fills come from mask rows, possibly steps before they are returned; their log-probs are
not kept, and such requests are refused (``request_validator.py``).

Every returned cell ([B, width], -1 where no token) reads one entry of a bank: this step's rows
first (N of them), then the kept slot-0 entries (one per table slot); vLLM drops the entries of
empty cells as it drops the cells.
"""

from __future__ import annotations

import sys

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

    def entries(self, raw_logits: torch.Tensor, tokens: torch.Tensor) -> LogprobsTensors:
        """[n, K + 1] entries of rows ([n, V] raw logits), each for its token ([n]; a negative one,
        an empty cell's, reads token 0)."""
        logprobs = Sampler.compute_logprobs(raw_logits)
        return Sampler.gather_logprobs(logprobs, min(self.k, logprobs.shape[-1]), tokens.long().clamp(min=0))

    def bank(self, rows: LogprobsTensors, slots: int) -> LogprobsTensors:
        """The step's rows, then the kept entries of ``slots`` table slots."""
        if self.kept is None or self.kept.logprobs.shape[0] < slots:
            grown = LogprobsTensors(torch.zeros(slots, rows.logprobs.shape[1], dtype=torch.long, device=self.device),
                                    torch.zeros(slots, rows.logprobs.shape[1], dtype=torch.float32,
                                                device=self.device),
                                    torch.zeros(slots, dtype=torch.long, device=self.device))
            if self.kept is not None:
                count = self.kept.logprobs.shape[0]
                grown.logprob_token_ids[:count] = self.kept.logprob_token_ids
                grown.logprobs[:count] = self.kept.logprobs
                grown.selected_token_ranks[:count] = self.kept.selected_token_ranks
            self.kept = grown
        return LogprobsTensors(torch.cat([rows.logprob_token_ids, self.kept.logprob_token_ids]),
                               torch.cat([rows.logprobs, self.kept.logprobs]),
                               torch.cat([rows.selected_token_ranks.long(), self.kept.selected_token_ranks]))

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

