"""Structured outputs on the V2 binding's canvases: the V1 binding's grammar matchers, placed on canvas rows.

Each request under a grammar has its own matcher in the worker (``adapter/grammar_rows.WindowGrammars``,
compiled by vLLM's structured-output backend from the request's parameters, as the scheduler's own
is), which follows the tokens as the step decides them. vLLM's scheduler computes no bitmask for a
WeDLM engine (``WeDLMScheduler.get_grammar_bitmask``: its runner would lay one over canvas rows as
if they were draft tokens) and advances its own matcher by the tokens reported, which this stage
keeps valid.

* **A plain window**: the row of its first undecided slot, whose context is exactly the request's
  output (the run the grammar followed last step, which this forward commits), is masked with the
  grammar's next-token mask and always filled; the fills right of it are drawn freely. After the
  step, the grammar follows the next leading run (what the next forward commits) and cuts it at its
  first fill it rejects, which becomes a mask again.
* **A lossless window** (a per-request AR one is a lossless window of one row): its leading run's
  rows verify its fills and the last draws the next token, each masked with the grammar after the
  run up to it (row 0: the grammar as it is, its slot 0 being the token the grammar followed when
  it was reported, or the prompt's last); so its tokens are AR's under the grammar. The grammar
  follows what the window reports.

The leading runs and reported tokens of windows under a grammar come to the host (one sync a step
with such a window), as the matchers are host objects.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_wedlm.adapter.grammar_rows import WindowGrammars, apply_masks
from vllm_wedlm.core.batch import leading_filled, reopen
from vllm_wedlm.v2.window_table import WindowStep, WindowTable


class CanvasGrammars:
    def __init__(self, grammars: WindowGrammars, table: WindowTable):
        self.grammars = grammars
        self.table = table

    def mask_rows(self, logits: torch.Tensor, step: WindowStep) -> torch.Tensor | None:
        """Mask ``logits`` [N, V] in place at the rows the grammars constrain; returns ``fill_first``
        ([B] bool: the plain windows whose first undecided slot is filled whatever its entropy), or
        None when no window of the step is under a grammar."""
        under = np.fromiter((record.grammar for record in step.records), bool, len(step.records))  # [B]
        if not under.any():
            return None
        device, plan = logits.device, step.plan
        first_row = np.cumsum(step.widths) - step.widths  # [B]
        masks, indices = [], []  # [n, words] int32 each; [n] rows each
        plain = np.flatnonzero(under & ~step.lossless_host)
        if len(plain):
            picked = torch.from_numpy(plain).to(device, non_blocking=True)
            first_mask = leading_filled(plan.windows.filled[picked])  # [G]: its first undecided slot
            row = (plan.order[picked] == first_mask[:, None]).int().argmax(1)  # [G]: that slot's row
            has_row = (first_mask < plan.windows.length[picked]) & step.rows[picked].gather(1, row[:, None])[:, 0]
            own = self.grammars.masks([step.req_ids[b] for b in plain]).to(device, non_blocking=True)
            masks.append(torch.where(has_row[:, None], own, -1))  # no row: its own row, left as it is
            indices.append(torch.from_numpy(first_row[plain]).to(device, non_blocking=True) + row)
        lossless = np.flatnonzero(under & step.lossless_host)
        if len(lossless):
            runs = self._leading_runs(plan.windows, lossless, device)
            for b, run in zip(lossless, runs, strict=True):
                req_id = step.req_ids[b]
                masks.append(torch.cat([self.grammars.masks([req_id]), self.grammars.masks_along(req_id, run[1:])]))
                indices.append(torch.arange(len(run), device=device) + int(first_row[b]))
        apply_masks(logits, torch.cat([m.to(device) for m in masks]), torch.cat(indices))
        fill_first = np.zeros(len(step.records), bool)
        fill_first[plain] = True
        return torch.from_numpy(fill_first).to(device, non_blocking=True)

    def follow(self, step: WindowStep, reported: torch.Tensor, count: torch.Tensor) -> None:
        """After the step's windows are finished and stored: advance each grammar by what its window
        decided (a plain window's next leading run, cut at the first fill the grammar rejects, which
        is made a mask again in the table) or reported (a lossless window's tokens, ``reported`` [B, C]
        and ``count`` [B], drawn under its masks)."""
        under = np.fromiter((record.grammar for record in step.records), bool, len(step.records))  # [B]
        if not under.any():
            return
        device = reported.device
        lossless = np.flatnonzero(under & step.lossless_host)
        if len(lossless):
            picked = torch.from_numpy(lossless).to(device, non_blocking=True)
            tokens, counts = reported[picked].tolist(), count[picked].tolist()
            for b, row, n in zip(lossless, tokens, counts, strict=True):
                self.grammars.follow_verified(step.req_ids[b], row[:n])
        plain = np.flatnonzero(under & ~step.lossless_host)
        if len(plain):
            slots = step.slots[torch.from_numpy(plain).to(device, non_blocking=True)]
            windows = self.table.windows.rows(slots)
            runs = self._leading_runs(windows, np.arange(len(plain)), device)
            # Each run's first fill the grammar rejects (the capacity: none), undecided again.
            kept = [self.grammars.accepted(step.req_ids[b], run) for b, run in zip(plain, runs, strict=True)]
            at = [k if k < len(run) else windows.capacity for k, run in zip(kept, runs, strict=True)]
            if min(at) < windows.capacity:
                self.table.windows.store(slots, reopen(windows, torch.tensor(at, device=device), self.table.mask_id))

    @staticmethod
    def _leading_runs(windows, picked: np.ndarray, device: torch.device) -> list[list[int]]:
        """The leading run of each window ``picked`` of ``windows`` (a ``WindowBatch``), on the host."""
        index = torch.from_numpy(picked).to(device, non_blocking=True)
        lengths = leading_filled(windows.filled[index]).tolist()
        return [row[:n] for row, n in zip(windows.tokens[index].tolist(), lengths, strict=True)]
