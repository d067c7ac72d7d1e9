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

This is the step's one log-prob stage: both row layouts call ``fill_rings`` (before the window
step moves the table on) and ``returned`` (after it), with where their rows are (``StepIndex``), and
keep no log-prob code of their own. Each entry is ``core/logprobs.py``'s.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors

from vllm_wedlm.core.logprobs import row_logprobs, token_entries

if TYPE_CHECKING:
    from vllm_wedlm.adapter.step_index import StepIndex
    from vllm_wedlm.adapter.step_rows import RequestState
    from vllm_wedlm.adapter.window_table import WindowTable


def chosen_ids(states: list[RequestState], batch_rows: np.ndarray) -> list[tuple[int, ...] | None] | None:
    """The ``logprob_token_ids`` of the request of each log-prob row (``batch_rows`` [n]: its index
    into ``states``), for ``TokenLogprobs.entries``; None when no request of the step asks."""
    if not any(state.logprob_token_ids for state in states):
        return None
    return [states[row].logprob_token_ids for row in batch_rows]


class TokenLogprobs:
    def __init__(self, max_logprobs: int, table: WindowTable, vocab_size: int):
        # Top K of every entry: the most a request may ask for (vLLM's max_logprobs; -1: no limit),
        # each request keeping its own number of them.
        self.k = max_logprobs if max_logprobs >= 0 else sys.maxsize
        self.table, self.vocab_size, self.device = table, vocab_size, table.device
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
        if not raw_logits.shape[0]:
            return self.no_entries(raw_logits.shape[-1])
        logprobs = row_logprobs(raw_logits)  # [n, V]
        entries = LogprobsTensors(*token_entries(logprobs, min(self.k, logprobs.shape[-1]),
                                                 tokens.long().clamp(min=0)))
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

    def no_entries(self, vocab_size: int | None = None) -> LogprobsTensors:
        """No rows, in the width ``entries`` gives rows of ``vocab_size`` logits (the model's)."""
        return _at_least(None, 0, min(self.k, vocab_size or self.vocab_size) + 1, self.device)

    # The stage.
    def fill_rings(self, raw_logits: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor | None,
                   slots: torch.Tensor, positions: torch.Tensor, states: list[RequestState],
                   row_requests: np.ndarray) -> None:
        """Before the window step: write the entry of each mask row that may fill a slot of a plain
        window whose request asks (``rows`` [m] logits rows of ``raw_logits``, or None: all of them,
        each drawing ``tokens`` [m]) to its table slot's ring (``slots`` [m]) at the position of the
        slot it may fill (``positions`` [m]; -1: a row that fills nothing, written to the sink, so a
        device-side choice needs no host sync). ``row_requests`` [m]: each row's index into ``states``."""
        table = self.table
        capacity, sink = table.capacity, table.num_slots * table.capacity
        ring = torch.where(positions >= 0, slots * capacity + positions % capacity, sink)
        entries = self.entries(raw_logits if rows is None else raw_logits[rows], tokens,
                               chosen_ids(states, row_requests))
        self._write_fills(entries, torch.arange(len(ring), device=self.device), ring, table.num_slots, capacity)

    def returned(self, raw_logits: torch.Tensor | None, sampled: torch.Tensor, index: StepIndex,
                 draw_tokens: torch.Tensor | None, plain: np.ndarray, run_starts: torch.Tensor,
                 states: list[RequestState]) -> LogprobsTensors:
        """The entries of every cell the step returns (``sampled`` [B, width], device, -1 after each
        request's tokens), for the requests that ask: cell 0 of a lossless window its kept entry and
        cell c > 0 its verification row c - 1 (or, where a lossless window does not return its slot 0
        again, cell c its row c); an AR-decoded request's cell 0 its draw's row; a plain
        window's run its ring (``fill_rings``). Then keep the entry of each lossless window's new
        slot 0 (its table row's token, drawn by the row after its run) and of each new lossless
        request's first token. ``draw_tokens`` [Bd] (device): the tokens of ``index.draws``;
        ``plain`` [Bp]: the batch rows of plain windows that return a run, which starts at
        ``run_starts`` [Bp] (device). No host sync."""
        table, device = self.table, self.device
        width = sampled.shape[1]
        wants = np.fromiter((state.logprobs for state in states), bool, len(states))  # [B]
        slots = index.slots
        asks = wants[index.lossless]
        lossless, first_check = index.lossless[asks], index.first_check[asks]  # [Bl]
        asks = np.flatnonzero(wants[index.draws])
        draws, draw_rows = index.draws[asks], index.draw_rows[asks]  # [Bd]
        # A lossless window's cells from ``lead`` on are its verification rows' draws (cell 0 is its
        # kept slot 0, where the window returns that slot again: ``StepIndex.returns_slot0``).
        lead = int(index.returns_slot0)
        # Rows to read: each lossless window's verification rows (past its run they are padding,
        # so a row past the step's last reads that one), each one's row after its run (its kept
        # entry), the draws.
        num_rows = 0 if raw_logits is None else raw_logits.shape[0]
        check = torch.from_numpy(np.minimum(first_check[:, None] + np.arange(width - lead)[None],
                                            max(num_rows - 1, 0))).to(device, non_blocking=True)  # [Bl, width - lead]
        lossless_rows = torch.from_numpy(lossless).to(device, non_blocking=True)
        lossless_slots = torch.from_numpy(slots[lossless]).to(device, non_blocking=True)
        after = lossless_slots[:0]  # [Bl] with a kept slot 0, else none
        if lead:
            run = (sampled[lossless_rows] >= 0).sum(1)  # [Bl]
            after = torch.from_numpy(first_check).to(device, non_blocking=True) + run - 1
        read = torch.cat([check.flatten(), after, torch.from_numpy(draw_rows).to(device, non_blocking=True)])
        if len(asks):
            draw_tokens = draw_tokens[torch.from_numpy(asks).to(device, non_blocking=True)].long()
        else:
            draw_tokens = after[:0]
        tokens = torch.cat([sampled[lossless_rows, lead:].flatten().long(),
                            table.windows.tokens[lossless_slots[: len(after)], 0], draw_tokens])
        row_requests = np.concatenate([np.repeat(lossless, width - lead), lossless[: len(after)], draws])  # [n]
        entries = (self.entries(raw_logits[read], tokens, chosen_ids(states, row_requests)) if num_rows
                   else self.no_entries())
        asks = wants[plain]
        plain = plain[asks]  # [Bp]
        capacity = table.capacity if len(plain) else 0
        bank = self._bank(entries, table.num_slots, capacity)
        n, num_checks, num_after = read.shape[0], check.numel(), len(after)
        source = torch.zeros(len(states), width, dtype=torch.long, device=device)  # [B, width]: bank entries
        if len(plain):  # each run's tokens sit at its next window's first positions
            plain_slots = torch.from_numpy(slots[plain]).to(device, non_blocking=True)
            starts = run_starts[torch.from_numpy(np.flatnonzero(asks)).to(device)]
            positions = starts[:, None] + torch.arange(width, device=device)[None]
            source[torch.from_numpy(plain).to(device, non_blocking=True)] = (
                n + table.num_slots + plain_slots[:, None] * capacity + positions % capacity)
        checks = torch.arange(num_checks, device=device).view(len(lossless), width - lead)
        source[lossless_rows] = torch.cat([n + lossless_slots[:, None], checks], 1) if lead else checks
        first = index.first_token[draws]  # [Bd]: new lossless requests (kept), the rest AR-decoded (returned)
        ar = np.flatnonzero(~first)
        source[torch.from_numpy(draws[ar]).to(device), 0] = torch.from_numpy(num_checks + num_after + ar).to(device)
        cells = _cells(bank, source)
        first = np.flatnonzero(first)
        self._keep(bank, torch.cat([lossless_slots[:num_after], torch.from_numpy(slots[draws[first]]).to(device)]),
                   torch.cat([torch.arange(num_checks, num_checks + num_after, device=device),
                              torch.from_numpy(num_checks + num_after + first).to(device)]))
        return cells

    def _bank(self, rows: LogprobsTensors, slots: int, capacity: int = 0) -> LogprobsTensors:
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

    def _write_fills(self, rows: LogprobsTensors, source: torch.Tensor, ring: torch.Tensor, slots: int,
                    capacity: int) -> None:
        """Write the entries ``source`` ([m]) of ``rows`` (this step's mask rows' entries) to the ring
        entries ``ring`` ([m]: table slot * capacity + absolute position mod capacity; ``slots *
        capacity``, one past the rings, takes writes that go nowhere, so a device-side choice needs no
        host sync), before ``_bank`` copies the rings for the cells to read."""
        self.fills = _at_least(self.fills, slots * capacity + 1, rows.logprobs.shape[1], self.device)
        self.fills.logprob_token_ids[ring] = rows.logprob_token_ids[source].long()
        self.fills.logprobs[ring] = rows.logprobs[source]
        self.fills.selected_token_ranks[ring] = rows.selected_token_ranks[source].long()

    def ring(self, slot: int) -> LogprobsTensors | None:
        """A copy of table ``slot``'s ring of fills (None: none written), for a binding whose request
        comes back in another slot after a preemption (vLLM 0.34's); ``put_ring`` gives it back."""
        if self.fills is None:
            return None
        capacity = self.table.capacity
        rows = slice(slot * capacity, (slot + 1) * capacity)
        return LogprobsTensors(*(part[rows].clone() for part in self.fills[:3]))

    def put_ring(self, slot: int, ring: LogprobsTensors) -> None:
        capacity, width = self.table.capacity, ring.logprobs.shape[1]
        self.fills = _at_least(self.fills, self.table.num_slots * capacity + 1, width, self.device)
        rows = slice(slot * capacity, (slot + 1) * capacity)
        self.fills.logprob_token_ids[rows, :width] = ring.logprob_token_ids
        self.fills.logprobs[rows, :width] = ring.logprobs
        self.fills.selected_token_ranks[rows] = ring.selected_token_ranks

    def _keep(self, bank: LogprobsTensors, slots: torch.Tensor, source: torch.Tensor) -> None:
        """Keep bank entries ``source`` ([m]) for table ``slots`` ([m]), after ``_cells`` read the old ones."""
        self.kept.logprob_token_ids[slots] = bank.logprob_token_ids[source]
        self.kept.logprobs[slots] = bank.logprobs[source]
        self.kept.selected_token_ranks[slots] = bank.selected_token_ranks[source]


def _cells(bank: LogprobsTensors, source: torch.Tensor) -> LogprobsTensors:
    """The entries of the returned cells: ``source`` [B, width] int64, each cell's bank entry."""
    flat = source.flatten()
    return LogprobsTensors(bank.logprob_token_ids[flat], bank.logprobs[flat], bank.selected_token_ranks[flat])


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
