"""One WeDLM decoding step of one request: plan the forward, then apply its results."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_wedlm.core.params import WeDLMParams
from vllm_wedlm.core.selection import choose_fills
from vllm_wedlm.core.window import Window


@dataclass(frozen=True)
class StepPlan:
    """What one forward of one request looks like."""

    window: Window  # after refill: the slots this forward covers, logical order
    order: torch.Tensor  # [n] int64, the window slot fed at each physical row
    num_commit: int  # leading filled slots: committed by this forward (their KV is exact)

    @property
    def input_ids(self) -> torch.Tensor:
        """[n] int64 token ids in physical order."""
        return self.window.tokens[self.order]

    @property
    def num_masks(self) -> int:
        """Mask rows: the last ``num_masks`` physical rows, the only rows whose logits are used."""
        return int((~self.window.filled).sum())

    @property
    def committed(self) -> torch.Tensor:
        """[num_commit] int64 tokens this step appends to the request."""
        return self.window.tokens[: self.num_commit]


def room(committed_len: int, limit: int) -> int:
    """Slots allowed after ``committed_len`` tokens: a window never reaches position ``limit``
    (min of prompt + max_tokens and max_model_len), so no KV is written past the end."""
    return max(0, limit - committed_len)


def plan_step(window: Window | None, window_size: int, committed_len: int, limit: int,
              mask_id: int) -> StepPlan:
    """Refill and reorder a request's window before its forward.

    ``window`` None starts a request (after prefill): min(window_size, room) masks. Otherwise the
    leading filled run (committed by this forward) is matched by as many new masks at the end,
    so ``window_size`` slots stay undecided, never past ``limit``.
    """
    if window is None:
        window = Window.of_masks(min(window_size, room(committed_len, limit)), mask_id)
    num_commit = window.leading_filled()
    refill = min(num_commit, room(committed_len, limit) - len(window))
    window = window.extended(refill, mask_id)
    return StepPlan(window=window, order=window.physical_order(), num_commit=num_commit)


def finish_step(plan: StepPlan, mask_entropy: torch.Tensor, mask_tokens: torch.Tensor,
                params: WeDLMParams) -> Window:
    """Commit the leading run, then fill the chosen masks; returns the next window.

    ``mask_entropy`` / ``mask_tokens``: [num_masks] entropy and drawn token of each mask row, in
    physical (= logical among masks) order.
    """
    remaining = plan.window.dropped(plan.num_commit)
    slots = remaining.mask_slots()
    chosen = choose_fills(mask_entropy, slots, params)
    return remaining.with_fills(slots[chosen], mask_tokens[chosen])
