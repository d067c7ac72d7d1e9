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


def room(committed_len: int, limit: int | None) -> int | None:
    """Window slots that fit after ``committed_len`` tokens: slots end before position ``limit``,
    the end of the request's KV room (vLLM's max_model_len); None when there is no such end."""
    return None if limit is None else max(0, limit - committed_len)


def plan_step(window: Window | None, window_size: int, committed_len: int, limit: int | None,
              mask_id: int) -> StepPlan:
    """Refill and reorder a request's window before its forward.

    ``window`` None starts a request (after prefill): ``window_size`` masks. Otherwise the leading
    filled run (committed by this forward) is matched by new masks at the end, so that
    ``window_size`` slots after it stay undecided. As in WeDLM's engine (wedlm.md 2.7), the window
    does not shrink as the request nears its max_tokens, which only truncates what is committed: a
    request's tokens do not depend on it. Only the KV room ends a window early: no slot at or
    past ``limit`` (max_model_len), where the request must end anyway.

    ``window_size`` may change from step to step (an adaptive window, ``core.window_policy``).
    A window longer than its new size allows loses its trailing masks, never a filled slot: it
    keeps every slot up to its last fill.
    """
    space = room(committed_len, limit)
    window = Window.of_masks(0, mask_id) if window is None else window
    num_commit = window.leading_filled()
    target = num_commit + window_size  # slots this forward covers: the run it commits, then W undecided
    if len(window) > target:
        window = window.truncated(max(target, window.filled_end()))
    else:
        end = target if space is None else min(target, space)
        window = window.extended(end - len(window), mask_id)
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
