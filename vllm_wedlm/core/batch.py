"""WeDLM's step for a batch of windows at once: tensor operations only, no per-request Python.

This is what the engine and the reference decoder run; ``step.py`` / ``window.py`` state the same
algorithm for one request at a time, readably, and the tests check that the two agree.

B windows are stored padded to a common capacity C (2 x the largest window size: a forward covers
at most the W slots kept between steps plus as many refilled masks as it commits). Slot j of row b
sits at logical position ``committed_b + j``. Invariant: past a row's length every slot holds the
mask id and is not filled, so refilling is just a longer length.

One step of every running request:

    plan = plan_windows(windows, window_size, committed_len, limit)   # refill, physical order
    logits = forward(plan.input_ids rows, positions=committed_len + plan.order)
    windows = finish_windows(plan.windows, plan.num_commit, entropy, tokens, tau, lam, mask_id)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WindowBatch:
    tokens: torch.Tensor  # [B, C] int64, logical order; the mask id at masks and past `length`
    filled: torch.Tensor  # [B, C] bool; False past `length`
    length: torch.Tensor  # [B] int64, slots in use

    @staticmethod
    def empty(batch: int, capacity: int, mask_id: int, device: torch.device | str = "cpu") -> WindowBatch:
        """Windows with no slot yet: the first ``plan_windows`` fills them with masks."""
        return WindowBatch(
            tokens=torch.full((batch, capacity), mask_id, dtype=torch.long, device=device),
            filled=torch.zeros(batch, capacity, dtype=torch.bool, device=device),
            length=torch.zeros(batch, dtype=torch.long, device=device),
        )

    @staticmethod
    def cat(parts: list[WindowBatch]) -> WindowBatch:
        if len(parts) == 1:
            return parts[0]  # the usual step (windows only): no copy
        return WindowBatch(*(torch.cat([getattr(p, name) for p in parts]) for name in ("tokens", "filled", "length")))

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    def slot_index(self) -> torch.Tensor:
        """[1, C] int64: 0, 1, ..., C-1."""
        return torch.arange(self.capacity, device=self.tokens.device)[None]

    def rows(self, index: torch.Tensor) -> WindowBatch:
        """The windows at ``index`` ([k] int64)."""
        return WindowBatch(self.tokens[index], self.filled[index], self.length[index])

    def store(self, index: torch.Tensor, windows: WindowBatch) -> None:
        """Write ``windows`` into rows ``index`` in place (a table of windows kept across steps)."""
        self.tokens[index] = windows.tokens
        self.filled[index] = windows.filled
        self.length[index] = windows.length


@dataclass(frozen=True)
class BatchPlan:
    """What one forward of each window looks like."""

    windows: WindowBatch  # after refill: the slots this forward covers
    order: torch.Tensor  # [B, C] int64: the slot fed at each physical row (rows past length: padding)
    num_commit: torch.Tensor  # [B] int64: leading filled slots, committed by this forward
    num_masks: torch.Tensor  # [B] int64: mask rows, the last ones of each forward

    @property
    def input_ids(self) -> torch.Tensor:
        """[B, C] int64 token ids in physical order (the first ``length`` of each row are forwarded)."""
        return self.windows.tokens.gather(1, self.order)


def _row_of_cell(cells: torch.Tensor) -> torch.Tensor:
    """[B, C] bool -> [B, C] int64: for each True cell, its index among the True cells in row-major
    order (window by window, slot by slot), i.e. which row of a flat per-cell input it reads; 0
    elsewhere. A gather through it needs no host sync."""
    return (cells.flatten().long().cumsum(0) - 1).clamp(min=0).view_as(cells)


def leading_filled(filled: torch.Tensor) -> torch.Tensor:
    """[B, C] bool -> [B] int64: each window's run of filled slots at the front, the tokens its next
    forward commits (filled is False past a window's length, so the run stops there)."""
    return filled.long().cumprod(1).sum(1)


def plan_windows(windows: WindowBatch, window_size: torch.Tensor | int, committed_len: torch.Tensor,
                 limit: torch.Tensor | None) -> BatchPlan:
    """Refill and reorder every window before its forward.

    The leading filled run (committed by this forward) is matched by new masks at the end so that
    ``window_size`` slots follow it ([B] or one int; an empty window gets ``window_size`` masks).
    Slots never reach ``limit`` ([B], the end of each request's KV room, vLLM's max_model_len; None:
    no end). ``committed_len`` [B]: tokens before each window. A window longer than a smaller
    ``window_size`` now allows (an adaptive window) loses its trailing masks, never a filled slot.
    """
    slot = windows.slot_index()
    num_commit = leading_filled(windows.filled)  # [B]
    target = num_commit + window_size  # [B]: the committed run, then window_size undecided slots
    filled_end = torch.where(windows.filled, slot + 1, 0).amax(1)  # [B]: one past the last fill
    # Longer than the target: cut to it, but keep every fill; shorter: grow to it (filled_end is
    # within the window). The slots past a window's length are already unfilled masks (invariant),
    # so either is just a new length.
    length = torch.maximum(target, filled_end)  # [B]
    if limit is not None:
        space = (limit - committed_len).clamp(min=0)  # [B] slots before the KV room ends
        length = torch.minimum(length, torch.maximum(space, windows.length))  # never grows past the room
    valid = slot < length[:, None]  # [B, C]
    # Filled slots first, then masks, each in logical order (a stable sort), padding last: the
    # leading filled run sits at its own positions, and the mask rows are each forward's last rows.
    key = torch.where(valid, (~windows.filled).to(torch.int8), 2)
    order = torch.argsort(key, dim=1, stable=True)
    num_masks = length - windows.filled.sum(1)
    return BatchPlan(WindowBatch(windows.tokens, windows.filled, length), order, num_commit, num_masks)


def plan_after_draw(draws: torch.Tensor, window_size: torch.Tensor, committed_len: torch.Tensor,
                    limit: torch.Tensor | int | None, capacity: int, mask_id: int) -> BatchPlan:
    """``plan_windows`` of windows that hold one token, filled in slot 0 (``draws`` [B]: the token an
    AR row drew for each), with ``window_size`` [B] masks after it: the window a request starts from
    after a draw (a window of W 0, its leading run alone, each step). The same plan in fewer
    operations, for a step a batch of them takes every token: with one filled slot first, masks
    next and padding last, the stable sort's order is the slot order, and the leading run is the draw."""
    batch = draws.shape[0]
    tokens = torch.full((batch, capacity), mask_id, dtype=torch.long, device=draws.device)  # [B, C]
    tokens[:, 0] = draws
    filled = torch.zeros(batch, capacity, dtype=torch.bool, device=draws.device)  # [B, C]
    filled[:, 0] = True
    length = window_size + 1  # [B]: the draw, then its masks (never below the fill: W >= 0)
    if limit is not None:  # an empty window's length is 0: the room left, as plan_windows cuts it
        length = torch.minimum(length, (limit - committed_len).clamp(min=0))
    order = torch.arange(capacity, device=draws.device).expand(batch, capacity)  # [B, C]
    return BatchPlan(WindowBatch(tokens, filled, length), order, torch.ones_like(length), length - 1)


def finish_windows(windows: WindowBatch, num_commit: torch.Tensor, mask_entropy: torch.Tensor,
                   mask_tokens: torch.Tensor, entropy_threshold: torch.Tensor, pos_penalty: torch.Tensor,
                   mask_id: int, verified: WindowBatch | None = None,
                   fill_first: torch.Tensor | None = None) -> WindowBatch:
    """Fill the chosen masks of every planned window (``BatchPlan.windows``), then drop its committed
    run (``num_commit`` [B]: ``BatchPlan.num_commit``, or ``verify_windows``'s); the next windows.

    ``mask_entropy`` [N] float32 / ``mask_tokens`` [N] int64: one entry per mask row of the planned
    windows, window by window, masks in logical order (= their physical order), N = ``num_masks.sum()``.
    ``entropy_threshold`` [B] float32 (tau; -inf where a request fills one mask per step) and
    ``pos_penalty`` [B] float32 (lambda): adjusted entropy = entropy + lambda * (slot - first mask
    slot); every mask strictly below tau is filled, or else the lowest (first on ties).
    ``verified``: the windows after ``verify_windows`` (lossless requests), filled on top of; a mask
    it filled (the token after an accepted run) is no longer a mask.
    ``fill_first`` ([B] bool, or None: none): windows whose first mask is filled whatever its
    entropy (a structured-output window's, drawn under its grammar: every step then returns a token).
    """
    if not mask_entropy.numel():
        return fill_masks(windows, num_commit, None, None, entropy_threshold, pos_penalty, mask_id, verified)
    is_mask = (windows.slot_index() < windows.length[:, None]) & ~windows.filled  # [B, C], the planned mask rows
    source = _row_of_cell(is_mask)  # [B, C]: mask k (window by window, logical order) reads row k
    return fill_masks(windows, num_commit, mask_entropy.float()[source], mask_tokens.long()[source],
                      entropy_threshold, pos_penalty, mask_id, verified, fill_first)


def slots_of_rows(values: torch.Tensor, order: torch.Tensor, first_row: torch.Tensor) -> torch.Tensor:
    """[B, R] per physical row -> [B, C] per slot: the value of the row that fed each slot.

    For a step whose logits are a fixed R rows per window (no host sync: how many of a window's
    rows are masks is known on the device only): row k of window b is its physical row
    ``first_row[b] + k`` (``order``: the plan's slot of each physical row). A slot fed outside those
    rows reads a clamped row: callers only read mask slots, which ``first_row`` must cover."""
    inverse = torch.empty_like(order).scatter_(1, order, _arange_like(order))  # [B, C] physical row of slot
    row = (inverse - first_row[:, None]).clamp(0, values.shape[1] - 1)  # [B, C]
    return values.gather(1, row)


def _arange_like(like: torch.Tensor) -> torch.Tensor:
    """[B, C] int64: 0..C-1 in every row, shaped as ``like``."""
    return torch.arange(like.shape[1], device=like.device).expand_as(like).contiguous()


def fill_masks(windows: WindowBatch, num_commit: torch.Tensor, entropy: torch.Tensor | None,
               drawn: torch.Tensor | None, entropy_threshold: torch.Tensor, pos_penalty: torch.Tensor,
               mask_id: int, verified: WindowBatch | None = None,
               fill_first: torch.Tensor | None = None) -> WindowBatch:
    """``finish_windows`` given each slot's entropy ([B, C] float32) and draw ([B, C] int64), read
    at mask slots only (None: no window has a mask row)."""
    slot = windows.slot_index()
    is_mask = (slot < windows.length[:, None]) & ~windows.filled  # [B, C], the planned mask rows
    start = windows if verified is None else verified
    tokens, filled = start.tokens, start.filled
    if entropy is not None:
        fillable = is_mask if verified is None else is_mask & ~filled & (slot < start.length[:, None])  # [B, C]
        first_mask = fillable.to(torch.int8).argmax(1, keepdim=True)  # [B, 1]
        adjusted = entropy + pos_penalty.float()[:, None] * (slot - first_mask).float()
        adjusted = adjusted.masked_fill(~fillable, float("inf"))
        chosen = fillable & (adjusted < entropy_threshold.float()[:, None])
        fallback = ~chosen.any(1) & fillable.any(1)  # [B]
        chosen |= fallback[:, None] & (slot == adjusted.argmin(1, keepdim=True))
        if fill_first is not None:
            chosen |= fill_first[:, None] & fillable & (slot == first_mask)
        tokens = torch.where(chosen, drawn, tokens)
        filled = filled | chosen
    return drop_leading(WindowBatch(tokens, filled, start.length), num_commit, mask_id)


def reopen(windows: WindowBatch, slot: torch.Tensor, mask_id: int) -> WindowBatch:
    """Each window with its slot ``slot`` ([B] int64; the capacity or more: none) a mask again: a
    fill that a structured output's grammar rejected, so the leading run ends before it. The fills
    right of it stay (never revised), to be checked again once the run reaches them."""
    cut = windows.slot_index() == slot[:, None]  # [B, C]
    return WindowBatch(windows.tokens.masked_fill(cut, mask_id), windows.filled & ~cut, windows.length)


def drop_leading(windows: WindowBatch, count: torch.Tensor, mask_id: int) -> WindowBatch:
    """Each window without its first ``count`` ([B]) slots: slot j takes slot j + count, and the
    freed tail becomes padding (the mask id, unfilled)."""
    shifted = windows.slot_index() + count[:, None]  # [B, C]
    inside = shifted < windows.capacity
    shifted = shifted.clamp(max=windows.capacity - 1)
    tokens = torch.where(inside, windows.tokens.gather(1, shifted), mask_id)
    filled = inside & windows.filled.gather(1, shifted)
    return WindowBatch(tokens, filled, windows.length - count)


# Lossless windows (``WeDLMParams.lossless``). Invariant: slot 0 of such a window holds the model's
# own next token (drawn from the AR row of the last committed token), and the rest of its leading
# run are unverified fills. A forward feeds the leading run first, in logical order, so the row of
# slot j sees exactly the committed tokens and slots 0..j: an AR row, whose distribution checks the
# fill at slot j + 1 (``sampling.verify``), and whose draw replaces it if rejected (or, after the
# run's last slot, is the next token). The committed run is slot 0 and the fills accepted after it;
# the token that follows it becomes the next window's slot 0. The logits rows a lossless window
# needs are its leading run's (rows 0..run-1) and its mask rows (its last rows), nothing else.

def verification_rows(windows: WindowBatch, lossless: torch.Tensor) -> torch.Tensor:
    """[B] int64: AR rows each planned window checks: its leading run when ``lossless`` ([B] bool)."""
    return torch.where(lossless, leading_filled(windows.filled), 0)


def verification_drafts(tokens: torch.Tensor, num_rows: torch.Tensor) -> torch.Tensor:
    """[R] int64, the draft each verification row checks, R = ``num_rows.sum()``: row j of a window
    checks slot j + 1 of its leading run; its last row checks nothing (-1) and draws the next
    token. ``tokens`` [B, C]: the windows' tokens, leading run first (logical or physical order)."""
    slot = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return dense_drafts(tokens, num_rows)[slot < num_rows[:, None]]


def verify_windows(windows: WindowBatch, num_rows: torch.Tensor, accepted: torch.Tensor, row_tokens: torch.Tensor,
                   window_size: torch.Tensor | int, mask_id: int) -> tuple[WindowBatch, torch.Tensor]:
    """Apply the checks of the lossless windows (``num_rows`` [B] > 0, ``verification_rows``) to the
    planned windows; the windows to fill on and each window's committed run [B].

    ``accepted`` [R] bool / ``row_tokens`` [R] int64: ``sampling.verify``'s answer for each
    verification row, window by window. A lossless window commits slot 0 and the accepted fills
    after it, up to the first rejected one; the first rejected fill becomes the row's token, the
    fills after it become masks again (drawn beside a rejected token), and when the whole run
    stands, the mask after it takes the last row's token. Other windows commit their leading run.
    A lossless window keeps ``window_size`` ([B] or one int) slots after its committed run, as a
    plain one does: after a rejection its tail past them is cut (its masks' draws are not used), so
    a window never outgrows 2 x ``window_size`` slots.
    """
    checked = windows.slot_index() < num_rows[:, None]  # [B, C]: verification row j exists
    if accepted.numel():
        source = _row_of_cell(checked)  # [B, C]
        accept, token = checked & accepted[source], row_tokens.long()[source]
    else:
        accept, token = torch.zeros_like(checked), torch.zeros_like(windows.tokens)
    return verify_dense(windows, num_rows, accept, token, window_size, mask_id)


def dense_drafts(tokens: torch.Tensor, num_rows: torch.Tensor) -> torch.Tensor:
    """``verification_drafts`` laid out per window, with no host sync: [B, C] int64, column j the
    draft that verification row j checks (slot j + 1 of the leading run), -1 where there is none."""
    slot = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return torch.where(slot + 1 < num_rows[:, None], tokens.roll(-1, dims=1), -1)


def verify_dense(windows: WindowBatch, num_rows: torch.Tensor, accept: torch.Tensor, token: torch.Tensor,
                 window_size: torch.Tensor | int, mask_id: int) -> tuple[WindowBatch, torch.Tensor]:
    """``verify_windows`` given each window's verification rows in place, column j of [B, C] being
    row j (``accept`` bool, False past ``num_rows``; ``token`` int64, the row's draw): the form a
    step of fixed rows has on the device, where how many rows each window checks is not known on
    the host."""
    slot = windows.slot_index()
    lead = leading_filled(windows.filled)  # [B]
    lossless = num_rows > 0  # [B]
    run = 1 + (accept & (slot + 1 < lead[:, None])).long().cumprod(1).sum(1)  # [B]: slot 0, then the accepted
    num_commit = torch.where(lossless, run, lead)
    after = token.gather(1, (run - 1).clamp(max=windows.capacity - 1)[:, None])  # [B, 1], slot run's token
    length = torch.where(lossless, torch.minimum(windows.length, run + window_size), windows.length)  # [B]
    placed = lossless[:, None] & (slot == run[:, None]) & (slot < length[:, None])
    dropped = lossless[:, None] & (slot > run[:, None]) & ((slot < lead[:, None]) | (slot >= length[:, None]))
    tokens = torch.where(placed, after, torch.where(dropped, mask_id, windows.tokens))
    filled = (windows.filled | placed) & ~dropped
    return WindowBatch(tokens, filled, length), num_commit
