"""Each request's window size W, per step, from what its windows commit and what rows cost.

A window of W undecided slots pays only where its fills get committed: a step forwards every
window's W mask rows (and its leading run), and commits only the leading run. Where text is
uncertain a wide window commits about one token per forward, and may commit nothing in a step
(the model fills confident slots right of an uncertain first one), while W = 1 always commits its
one fill the next step: an AR-priced step. Where text is predictable a wide window commits ten.

The model behind the choice:

* **What a request commits** is its ``reach``: for each slot k of a window (from 0), a moving
  average of whether a forward's committed run reached it (run > k), over about its last four
  forwards (``update_reach``). Slot k of its next window is expected to commit ``reach[k]`` tokens
  (its *gain*). This is the run's measured distribution, not a shape assumed from its mean: a
  request whose runs swing between nothing and the whole window (counting on ``small``: 0 tokens in
  37% of forwards, 12 to 16 in 10%) keeps the share of long runs on every deep slot, where a
  geometric run of the same mean (about 3) gave slot 10 a fifth of it and cut the window to 7 slots
  (lab notebook 5.29). A forward that committed its whole window was censored by W: the slots past
  it count as reached with chance ``CENSORED_REACH`` ** j (j slots past the end), so a window that
  keeps filling up grows by a few slots a forward. A window of one slot commits it whatever the
  model's confidence, so its full forward says little: the slots past it count
  ``SINGLE_SLOT_REACH`` ** j, which settles slot 1 of a request at W = 1 at 1/8: worth a row only
  while rows are nearly free (a small batch, a host-bound model). So such a request keeps probing
  W = 2 where probing costs nothing, and stays at W = 1 on a compute-bound batch (lab notebook
  5.20). A reach is non-increasing along the window (each forward's observation is), so a window's
  gains decrease slot by slot.
* **What a step costs** (``StepCost``): fixed seconds per step (host work and reading the weights),
  nothing more per row up to the knee (the rows a forward takes at the cost of its weight reads),
  and each row's FLOPs beyond it. On a host-bound model every row below the knee is free; on a
  compute-bound batch (the Qwen3-8B shape at batch 64) each one costs.

``choose_window_sizes`` then gives every request W = 1 and adds slots in order of gain, keeping the
count that maximises the batch's expected committed tokens per second. The gains are decreasing
per request and the cost convex in rows, so tokens per second rise then fall along that order and
the best prefix is the best choice of all (``tests/test_window_policy.py`` checks it against every
choice). A slot of gain below ``MIN_SLOT_GAIN`` is never added: no row is quite free (its logits
row, its share of host work).

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

#: Weight of a forward in each request's reach: about the last four forwards count.
REACH_WEIGHT = 0.25
#: Slot j past a full window of more than one slot counts as reached with chance CENSORED_REACH ** j.
CENSORED_REACH = 0.5
#: The same past a full window of one slot (it always commits): slot 1 then settles at 1/8.
SINGLE_SLOT_REACH = 0.125
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


def full_reach(max_window: int) -> list[float]:
    """The reach of a request nothing is known of: every slot reached (the whole window)."""
    return [1.0] * max_window


def update_reach(reach: list[float], committed: int, window_size: int) -> list[float]:
    """A request's ``reach`` (one float per slot of the largest window) after a forward of a window
    of ``window_size`` slots that committed ``committed`` tokens: the slots before the run's end
    were reached, those after it not, unless the run filled the window (censored: slot j past the
    end counts ``CENSORED_REACH ** j``, ``SINGLE_SLOT_REACH ** j`` past a window of one slot).
    Python numbers: the scheduler updates one request at a time, every step."""
    if committed >= window_size:  # full: what lies past it is unknown
        tail = SINGLE_SLOT_REACH if window_size == 1 else CENSORED_REACH
        return [r + REACH_WEIGHT * ((1.0 if k < committed else tail ** (k - committed + 1)) - r)
                for k, r in enumerate(reach)]
    return [r + REACH_WEIGHT * ((k < committed) - r) for k, r in enumerate(reach)]


def expected_run(reach: torch.Tensor) -> torch.Tensor:
    """[B] float64: each request's expected committed run (the sum of its reach [B, W]): the rows its
    window's leading run adds to the step after."""
    return reach.double().sum(1)


def expected_commits(reach: torch.Tensor, window_size: torch.Tensor) -> torch.Tensor:
    """[B] float64: the tokens a forward of windows of ``window_size`` ([B]) slots is expected to
    commit: the gains (``reach`` [B, W]) of each window's slots, those below ``MIN_SLOT_GAIN`` past
    the first counting nothing."""
    gains = _usable(reach.double())
    columns = torch.arange(gains.shape[1], device=gains.device)[None]
    return torch.where(columns < window_size[:, None], gains, 0).sum(1)


def usable_slots(reach: torch.Tensor) -> torch.Tensor:
    """[B] int64: the slots of each window expected to commit at least ``MIN_SLOT_GAIN`` tokens (the
    first always): the gains decrease along a window, so these are its first ones."""
    return (reach[:, 1:] >= MIN_SLOT_GAIN).sum(1) + 1


def _usable(gains: torch.Tensor) -> torch.Tensor:
    usable = gains.clone()
    usable[:, 1:] = torch.where(gains[:, 1:] >= MIN_SLOT_GAIN, gains[:, 1:], 0)
    return usable


def choose_window_sizes(reach: torch.Tensor, cost: StepCost, run_rows: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64 in [1, W]: the W of each request's next window that maximises the batch's expected
    committed tokens per second (``expected_commits`` over ``cost``).

    ``reach`` [B, W]: each request's (``update_reach``; W the largest window); ``run_rows`` [B]: the
    rows each window's leading run adds to the step (default: ``expected_run``). Every window gets
    one slot; the others go in order of gain (a request's slots in order, the gains being
    decreasing), as many as tokens per second keep rising."""
    batch, max_window = reach.shape
    if not batch:
        return torch.zeros(0, dtype=torch.int64, device=reach.device)
    if run_rows is None:
        run_rows = expected_run(reach)
    if every_usable_slot_pays(cost, batch, max_window, float(run_rows.sum())):
        return usable_slots(reach)  # the best prefix's answer, with no sort
    return best_prefix_sizes(reach, cost, run_rows)


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


def best_prefix_sizes(reach: torch.Tensor, cost: StepCost, run_rows: torch.Tensor) -> torch.Tensor:
    """``choose_window_sizes`` by its definition (every window one slot, then the others in order of
    gain, the prefix of the best rate), for a non-empty batch: a sort of every slot."""
    batch, max_window = reach.shape
    gains = _usable(reach.double())  # [B, W]
    extra = gains[:, 1:].flatten()  # [B * (W - 1)]: every slot past each window's first
    order = torch.argsort(extra, descending=True, stable=True)
    base_gain = gains[:, 0].sum()  # the first slots
    base_rows = run_rows.double().sum() + batch
    count = torch.arange(extra.numel() + 1, dtype=torch.float64, device=reach.device)  # slots added
    gain = base_gain + torch.cat([extra.new_zeros(1), extra[order].cumsum(0)])
    rate = gain / cost(base_rows + count)  # [B * (W - 1) + 1] tokens per second of each prefix
    rate = torch.where(torch.cat([rate.new_ones(1, dtype=torch.bool), extra[order] > 0]), rate, -1.0)
    best = int(torch.argmax(rate))  # the first maximum: the fewest rows at the best rate
    added = torch.zeros_like(extra, dtype=torch.int64)
    added[order[:best]] = 1
    return 1 + added.view(batch, max_window - 1).sum(1)


def choose_step(reach: torch.Tensor, cost: StepCost, ar_step: float,
                run_rows: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64 in [0, W]: ``choose_window_sizes``'s windows, or W 0 for every request (an AR step
    of the whole batch) where that is expected to commit more tokens per second.

    ``ar_step``: the seconds of an AR step of this batch (vLLM's own step, which commits one token per
    request whatever the text). On a host-bound model a window step costs more than an AR step (its
    mask rows, its host work), so where windows commit about one token per forward (uncertain text)
    AR is faster; a tie goes to AR, the cheaper step to run. The choice is the batch's, not each
    request's: the saving comes from the step being vLLM's whole (no window of any request)."""
    if run_rows is None:
        run_rows = expected_run(reach)
    sizes = choose_window_sizes(reach, cost, run_rows)
    if not sizes.numel():
        return sizes
    window_rate = expected_commits(reach, sizes).sum() / cost(run_rows.double().sum() + sizes.sum())
    return torch.zeros_like(sizes) if sizes.numel() / ar_step >= float(window_rate) else sizes


def choose_step_on_host(reaches: list[list[float]], cost: StepCost, ar_step: float) -> list[int] | None:
    """``choose_step`` of the requests of ``reaches`` (each one's ``update_reach``; their runs taken
    as ``expected_run``), in Python numbers, where every usable slot pays (``every_usable_slot_pays``:
    each window is then its usable slots, ``usable_slots``, with no sort); None where that does not
    hold (ask ``choose_step``)."""
    batch = len(reaches)
    if not batch:
        return None
    run_rows = sum(sum(reach) for reach in reaches)
    if not every_usable_slot_pays(cost, batch, len(reaches[0]), run_rows):
        return None
    sizes, commits = [], 0.0
    for reach in reaches:
        size = 1
        for gain in reach[1:]:  # the gains decrease: the usable slots come first
            if gain < MIN_SLOT_GAIN:
                break
            size += 1
            commits += gain
        commits += reach[0]
        sizes.append(size)
    window_rate = commits / cost.seconds(run_rows + sum(sizes))
    return [0] * batch if batch / ar_step >= window_rate else sizes
