"""Each request slot's WeDLM window, kept on the device between steps (V2's per-slot state), and
the plan of one step's windows (``WindowStep``), made before the forward and finished after it.

vLLM's V2 runner gives every running request a slot (its row in the runner's request state) and
removes a request both when it finishes and when it is preempted, without saying which. A removed
request's window is kept aside by request id, with the length of its committed tokens: a
preempted request comes back with exactly those tokens to prefill, and then resumes its window
where it stopped (its fills are never lost, so its output does not depend on the preemption).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from vllm_wedlm.adapter.step_index import StepIndex
from vllm_wedlm.core.batch import BatchPlan, WindowBatch
from vllm_wedlm.core.params import DEFAULT_PARAMS, WeDLMParams, selection_values


def canvas_width(window_size: int) -> int:
    """Rows of a window's forward: its committed run (at most ``window_size``) and ``window_size``
    undecided slots after it (``core.batch``'s capacity)."""
    return 2 * window_size


@dataclass(frozen=True)
class WindowStep:
    """The windows of one step, planned before the forward and finished by the sampler."""

    batch_index: torch.Tensor  # [B] int64: each window's request in the step's batch
    slots: torch.Tensor  # [B] int64: its slot in the table
    plan: BatchPlan  # refilled windows and their physical order
    rows: torch.Tensor  # [B, C] bool: canvas rows the step forwards (all C but near max_model_len)
    lossless: torch.Tensor  # [B] bool: a window whose slot 0 is the model's own next token, its run verified
    # On the host: each window's request id, its slot, its canvas's rows (its logits rows) and its
    # request's record (``protocol.RequestRecord``).
    req_ids: list[str]
    host_slots: np.ndarray  # [B] int64
    widths: np.ndarray  # [B] int64
    records: list
    lossless_host: np.ndarray  # [B] bool: ``lossless`` on the host, read without a sync mid-step
    # Where the step's rows are for the log-prob stage (``adapter/token_logprobs.py``), when a
    # request of the step asks for log-probs; else None.
    index: StepIndex | None = None


class WindowTable:
    def __init__(self, max_num_reqs: int, window_size: int, mask_id: int, device: torch.device | str):
        self.window_size = window_size
        self.mask_id = mask_id
        self.device = device
        self.windows = WindowBatch.empty(max_num_reqs, canvas_width(window_size), mask_id, device)
        # [max_num_reqs] int64: tokens before each slot's window (prompt + committed output).
        self.committed = torch.zeros(max_num_reqs, dtype=torch.long, device=device)
        # [max_num_reqs] int64: each slot's W (its request's canvas of 2 W rows; a narrower one, fewer).
        self.window_size_of = torch.full((max_num_reqs,), window_size, dtype=torch.long, device=device)
        # [max_num_reqs] float32: each slot's entropy threshold (-inf: one fill a step) and position
        # penalty (``selection_values``), its request's knobs.
        self.entropy_threshold = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.pos_penalty = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        # [max_num_reqs] bool: a lossless window (a per-request AR one is a lossless window of one
        # row): its slot 0 holds its unforwarded next token, drawn from an AR row.
        self.lossless = torch.zeros(max_num_reqs, dtype=torch.bool, device=device)
        self.slot_of: dict[str, int] = {}
        # Windows of removed requests, oldest first: request id -> (committed length, window).
        self.kept: OrderedDict[str, tuple[int, WindowBatch]] = OrderedDict()
        self.max_kept = max_num_reqs
        self.num_resumed = 0  # windows given back to preempted requests
        self.resumed_fills = 0  # filled slots they held (one host sync per resumed request)

    @property
    def capacity(self) -> int:
        """Slots of a window (its canvas's rows)."""
        return self.windows.capacity

    @property
    def num_slots(self) -> int:
        return len(self.committed)

    def add(self, slot: int, req_id: str, num_tokens: int, window_size: int | None = None,
            params: WeDLMParams = DEFAULT_PARAMS, next_token: int | None = None) -> None:
        """Give ``slot`` to a request of ``num_tokens`` tokens to prefill: its kept window when it
        was removed at that length (a preemption), else none yet (the first step plans W masks);
        its W is ``window_size`` (None: the table's), its knobs ``params``. A lossless window
        (``params.lossless``) starts with its unforwarded ``next_token`` in slot 0 (the prompt's last
        token, at first), after the ``num_tokens`` before it."""
        kept = self.kept.pop(req_id, None)
        if kept is not None and kept[0] == num_tokens:
            window = kept[1]
            self.num_resumed += 1
            self.resumed_fills += int(window.filled.sum())
        else:
            window = WindowBatch.empty(1, self.windows.capacity, self.mask_id, self.device)
            if params.lossless:
                window.tokens[0, 0], window.filled[0, 0] = next_token, True
        self.windows.store(torch.tensor([slot], device=self.device), window)
        self.committed[slot] = num_tokens
        self.window_size_of[slot] = self.window_size if window_size is None else window_size
        self.entropy_threshold[slot], self.pos_penalty[slot] = selection_values(params)  # (scalars: no copy)
        self.lossless[slot] = params.lossless
        self.slot_of[req_id] = slot

    def remove(self, req_id: str) -> None:
        """Free the request's slot, keeping its window in case it was preempted (one host sync)."""
        slot = self.slot_of.pop(req_id, None)
        if slot is None:
            return
        index = torch.tensor([slot], device=self.device)
        self.kept[req_id] = (int(self.committed[slot]), self.windows.rows(index))
        while len(self.kept) > self.max_kept:  # finished requests' windows are never asked for
            self.kept.popitem(last=False)
