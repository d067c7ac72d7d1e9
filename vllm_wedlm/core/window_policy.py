"""Each request's window size W, per step, from what its windows commit and what rows cost.

A window of W undecided slots pays only where its fills get committed: a step forwards every
window's W mask rows (and its leading run), and commits only the leading run. Where text is
uncertain a wide window commits about one token per forward, and may commit nothing in a step
(the model fills confident slots right of an uncertain first one), while W = 1 always commits its
one fill the next step: an AR-priced step. Where text is predictable a wide window commits ten.

The model behind the choice:

* **What a request commits.** ``commit_estimate`` is a moving average of the tokens each of its
  forwards committed. A forward that committed its whole window was censored by W (it might have
  committed more), so it counts ``CENSORED_BONUS`` more: a window that keeps filling up grows. A
  window of one slot commits it whatever the model's confidence, so its full forward says little and
  counts only ``SINGLE_SLOT_BONUS`` more: the estimate of a request at W = 1 settles at 1 plus that,
  where a second slot is worth a row only while rows are nearly free (a small batch, a host-bound
  model). So such a request keeps probing W = 2 where probing costs nothing, and stays at W = 1 on a
  compute-bound batch (where the full bonus made it alternate W 1 and 2: 0.62x AR's throughput
  against W 1's 0.88x on the Qwen3-8B shape at batch 64, lab notebook 5.20). The run a request would commit
  with an unbounded window is taken as geometric with that mean: each slot after the first is
  committed with probability ``q`` = 1 - 1 / estimate after the one before it, so slot w (counted
  from 1) is expected to commit ``q ** (w - 1)`` tokens (``slot_gains``). The first slot commits one
  token always.
* **What a step costs** (``StepCost``): fixed seconds per step (host work and reading the weights),
  nothing more per row up to the knee (the rows a forward takes at the cost of its weight reads),
  and each row's FLOPs beyond it. On a host-bound model every row below the knee is free; on a
  compute-bound batch (the Qwen3-8B shape at batch 64) each one costs.

``choose_window_sizes`` then gives every request W = 1 and adds slots in order of expected commit,
keeping the count that maximises the batch's expected committed tokens per second. The gains are
decreasing per request and the cost convex in rows, so tokens per second rise then fall along that
order and the best prefix is the best choice of all (``tests/test_window_policy.py`` checks it
against every choice). A slot expected to commit less than ``MIN_SLOT_GAIN`` is never added: no row
is quite free (its logits row, its share of host work).

``choose_step`` adds the floor, W 0 (an AR step, ``reference/decoder.py`` replays it): where the best
windows are expected to commit fewer tokens per second than an AR step of the batch (one token per
request, at the AR step's own measured cost), every request steps AR. The synchronous engine asks it
before every step (``adapter/window_sizer.py``), timing its own steps for both costs.

``choose_step_on_host`` is ``choose_step`` in Python numbers for the common case (every usable slot
pays): the scheduler asks it before every step, where a few dozen small tensor operations would cost
a host-bound model's step a tenth of its time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Weight of a forward's commits in the moving average: about the last four forwards count.
COMMIT_AVERAGE_WEIGHT = 0.25
#: What a forward that committed its whole window adds to the estimate beyond its commits.
CENSORED_BONUS = 0.5
#: The same for a window of one slot (it always commits): a second slot then expects 1/9 of a token.
SINGLE_SLOT_BONUS = 0.125
#: A slot whose expected commit is below this is not forwarded, whatever rows cost.
MIN_SLOT_GAIN = 1 / 16


@dataclass(frozen=True)
class StepCost:
    """Seconds of a step that forwards ``rows`` tokens: ``fixed + per_row * max(rows - knee, 0)``."""

    fixed: float
    """Seconds of a step of at most ``knee`` rows: host work and the weights' reads."""

    per_row: float
    """Seconds of each row beyond the knee (its FLOPs)."""

    knee: int
    """Rows a forward takes at no extra cost."""

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[...] float64 seconds of steps of ``rows`` ([...]) rows."""
        return self.fixed + self.per_row * (rows.double() - self.knee).clamp(min=0)

    def seconds(self, rows: float) -> float:
        """The seconds of one step of ``rows`` rows, as a Python number (the scheduler's)."""
        return self.fixed + self.per_row * max(rows - self.knee, 0.0)


def update_commit_estimate(estimate, committed, window_size):
    """Each estimate (``commit_estimate``) after a forward that committed ``committed`` tokens of a
    window of ``window_size`` slots: [B] tensors (float32 out) or one request's numbers (the
    scheduler's, per request: no tensor to build)."""
    full = committed >= window_size
    bonus = CENSORED_BONUS * full * (window_size > 1) + SINGLE_SLOT_BONUS * full * (window_size == 1)
    observed = committed + bonus  # a full window counts more
    return estimate + COMMIT_AVERAGE_WEIGHT * (observed - estimate)


def slot_gains(estimate: torch.Tensor, max_window: int) -> torch.Tensor:
    """[B, max_window] float64: the tokens each slot of a request's window is expected to commit
    (slot 0 always 1; slot w ``q ** w``, q = 1 - 1 / estimate), from ``estimate`` [B] (the mean
    commits per forward; at most 1 makes q 0)."""
    q = (1 - 1 / estimate.double().clamp(min=1)).clamp(0, 1)  # [B]
    w = torch.arange(max_window, dtype=torch.float64, device=estimate.device)
    return q[:, None] ** w[None]  # 0 ** 0 is 1: slot 0


def expected_commits(estimate: torch.Tensor, window_size: torch.Tensor) -> torch.Tensor:
    """[B] float64: the tokens a forward of windows of ``window_size`` ([B]) slots is expected to
    commit under ``slot_gains``'s model (the gains of each window's slots, those below
    ``MIN_SLOT_GAIN`` past the first counting nothing)."""
    gains = _usable(slot_gains(estimate, int(window_size.max())))
    columns = torch.arange(gains.shape[1], device=gains.device)[None]
    return torch.where(columns < window_size[:, None], gains, 0).sum(1)


def usable_slots(estimate: torch.Tensor, max_window: int) -> torch.Tensor:
    """[B] int64: the slots of each window expected to commit at least ``MIN_SLOT_GAIN`` tokens (the
    first always, its gain being 1): the gains decrease along a window, so these are its first ones."""
    return (slot_gains(estimate, max_window) >= MIN_SLOT_GAIN).sum(1)


def _usable(gains: torch.Tensor) -> torch.Tensor:
    usable = gains.clone()
    usable[:, 1:] = torch.where(gains[:, 1:] >= MIN_SLOT_GAIN, gains[:, 1:], 0)
    return usable


def choose_window_sizes(estimate: torch.Tensor, max_window: int, cost: StepCost,
                        run_rows: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64 in [1, max_window]: the W of each request's next window that maximises the batch's
    expected committed tokens per second (``expected_commits`` over ``cost``).

    ``estimate`` [B]: each request's ``commit_estimate``; ``run_rows`` [B]: the rows each window's
    leading run adds to the step (default: the estimate, capped at ``max_window``). Every window
    gets one slot; the others go in order of expected commit (a request's slots in order, the gains
    being decreasing), as many as tokens per second keep rising."""
    batch = estimate.shape[0]
    if not batch:
        return torch.zeros(0, dtype=torch.int64, device=estimate.device)
    if run_rows is None:
        run_rows = estimate.clamp(0, max_window)
    if every_usable_slot_pays(cost, batch, max_window, float(run_rows.sum())):
        return usable_slots(estimate, max_window)  # the best prefix's answer, with no sort
    return best_prefix_sizes(estimate, max_window, cost, run_rows)


def every_usable_slot_pays(cost: StepCost, batch: int, max_window: int, run_rows: float) -> bool:
    """Whether every slot expected to commit ``MIN_SLOT_GAIN`` raises the batch's tokens per second
    whatever else the step forwards, so that the best prefix is every such slot (``usable_slots``):
    the common case, which then needs no sort (host work the scheduler does every step).

    Either every window whole fits below the knee (rows cost nothing: a small batch), or rows cost
    next to nothing (a host-bound model). A slot of gain g added to a step of gain G and cost C at
    a row cost of at most ``per_row`` raises G / C when g * C > per_row * G; with g at least
    ``MIN_SLOT_GAIN``, C at least ``fixed`` and G at most one token per slot of every window, that
    holds when ``MIN_SLOT_GAIN * fixed > per_row * batch * max_window``, asked here with a factor 2
    to spare for rounding."""
    if run_rows + batch * max_window <= cost.knee:
        return True
    return 2 * cost.per_row * batch * max_window < MIN_SLOT_GAIN * cost.fixed


def best_prefix_sizes(estimate: torch.Tensor, max_window: int, cost: StepCost, run_rows: torch.Tensor) -> torch.Tensor:
    """``choose_window_sizes`` by its definition (every window one slot, then the others in order of
    expected commit, the prefix of the best rate), for a non-empty batch: a sort of every slot."""
    batch = estimate.shape[0]
    gains = _usable(slot_gains(estimate, max_window))  # [B, W]
    extra = gains[:, 1:].flatten()  # [B * (W - 1)]: every slot past each window's first
    order = torch.argsort(extra, descending=True, stable=True)
    base_gain = float(batch)  # the first slots
    base_rows = run_rows.double().sum() + batch
    count = torch.arange(extra.numel() + 1, dtype=torch.float64, device=estimate.device)  # slots added
    gain = base_gain + torch.cat([extra.new_zeros(1), extra[order].cumsum(0)])
    rate = gain / cost(base_rows + count)  # [B * (W - 1) + 1] tokens per second of each prefix
    rate = torch.where(torch.cat([rate.new_ones(1, dtype=torch.bool), extra[order] > 0]), rate, -1.0)
    best = int(torch.argmax(rate))  # the first maximum: the fewest rows at the best rate
    added = torch.zeros_like(extra, dtype=torch.int64)
    added[order[:best]] = 1
    return 1 + added.view(batch, max_window - 1).sum(1)


def choose_step(estimate: torch.Tensor, max_window: int, cost: StepCost, ar_step: float,
                run_rows: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64 in [0, max_window]: ``choose_window_sizes``'s windows, or W 0 for every request (an
    AR step of the whole batch) where that is expected to commit more tokens per second.

    ``ar_step``: the seconds of an AR step of this batch (vLLM's own step, which commits one token per
    request whatever the text). On a host-bound model a window step costs more than an AR step (its
    mask rows, its host work), so where windows commit about one token per forward (uncertain text)
    AR is faster; a tie goes to AR, the cheaper step to run. The choice is the batch's, not each
    request's: the saving comes from the step being vLLM's whole (no window of any request)."""
    if run_rows is None:
        run_rows = estimate.clamp(0, max_window)
    sizes = choose_window_sizes(estimate, max_window, cost, run_rows)
    if not sizes.numel():
        return sizes
    window_rate = expected_commits(estimate, sizes).sum() / cost(run_rows.double().sum() + sizes.sum())
    return torch.zeros_like(sizes) if sizes.numel() / ar_step >= float(window_rate) else sizes


def choose_step_on_host(estimates: list[float], max_window: int, cost: StepCost, ar_step: float) -> list[int] | None:
    """``choose_step`` of the requests of ``estimates`` (each one's ``commit_estimate``; their runs
    taken as the estimates, capped at ``max_window``), in Python numbers, where every usable slot pays
    (``every_usable_slot_pays``: each window is then its usable slots, ``usable_slots``, with no
    sort); None where that does not hold (ask ``choose_step``)."""
    batch = len(estimates)
    run_rows = sum(min(max(e, 0.0), max_window) for e in estimates)
    if not batch or not every_usable_slot_pays(cost, batch, max_window, run_rows):
        return None
    sizes, commits = [], 0.0
    for estimate in estimates:
        q = min(max(1 - 1 / max(estimate, 1.0), 0.0), 1.0)  # as slot_gains
        size, gain = 0, 1.0
        while size < max_window and (size == 0 or gain >= MIN_SLOT_GAIN):  # the gains decrease
            commits += gain
            size += 1
            gain *= q
        sizes.append(size)
    window_rate = commits / cost.seconds(run_rows + sum(sizes))
    return [0] * batch if batch / ar_step >= window_rate else sizes
