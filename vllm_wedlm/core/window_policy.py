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
``zero_windows`` is the floor per request, for the engine of fixed window rows: W 0 (a window of its
leading run alone, which draws one token from the run's last row) wherever a request's chosen
window is expected to commit no more than that one token.

It is all Python numbers, not tensors: the scheduler chooses before every step, for at most a few
hundred requests of 16 slots, where the few dozen small tensor operations of a sort cost more than
the arithmetic itself (at batch 64 on the Qwen3-8B shape's curve: 0.6 ms a step on a 2-core CPU in
tensors, 0.1 ms in Python; a step of the async engine hides its host work only up to the forward's
time). The search walks the slots in order of gain and stops at the rate's peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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

    def seconds(self, rows: float) -> float:
        """The seconds of one step of ``rows`` rows."""
        return self.fixed + self.per_row * max(rows - self.knee, 0.0)


def full_reach(max_window: int) -> list[float]:
    """The reach of a request nothing is known of: every slot reached (the whole window)."""
    return [1.0] * max_window


def update_reach(reach: list[float], committed: int, window_size: int) -> list[float]:
    """A request's ``reach`` (one float per slot of the largest window) after a forward of a window
    of ``window_size`` slots that committed ``committed`` tokens: the slots before the run's end
    were reached, those after it not, unless the run filled the window (censored: slot j past the
    end counts ``CENSORED_REACH ** j``, ``SINGLE_SLOT_REACH ** j`` past a window of one slot)."""
    keep = 1.0 - REACH_WEIGHT
    reached = [keep * r + REACH_WEIGHT for r in reach[:committed]]
    if committed >= window_size:  # full: what lies past it is unknown
        tail = _censored_tail(window_size == 1, len(reach) - committed)
        return reached + [keep * r + t for r, t in zip(reach[committed:], tail, strict=True)]
    return reached + [keep * r for r in reach[committed:]]


@functools.cache
def _censored_tail(single_slot: bool, slots: int) -> tuple[float, ...]:
    """What ``update_reach`` adds to each of the ``slots`` slots past a full window."""
    tail = SINGLE_SLOT_REACH if single_slot else CENSORED_REACH
    return tuple(REACH_WEIGHT * tail ** j for j in range(1, slots + 1))


def expected_run(reaches: list[list[float]]) -> float:
    """The rows the batch's leading runs add to its next step: each request's expected committed
    run, the sum of its reach."""
    return sum(sum(reach) for reach in reaches)


def usable_gains(reach: list[float]) -> list[float]:
    """The gains of a request's slots worth a row: the first always, then those of at least
    ``MIN_SLOT_GAIN`` (the gains decrease along a window, so these are its first ones)."""
    usable = 1
    while usable < len(reach) and reach[usable] >= MIN_SLOT_GAIN:
        usable += 1
    return reach[:usable]


def expected_commits(reaches: list[list[float]], sizes: list[int]) -> float:
    """The tokens a forward of windows of ``sizes`` slots is expected to commit: the gains of each
    window's slots, those below ``MIN_SLOT_GAIN`` past the first counting nothing."""
    return sum(sum(usable_gains(reach)[:size]) for reach, size in zip(reaches, sizes, strict=True))


def every_usable_slot_pays(cost: StepCost, batch: int, max_window: int, run_rows: float) -> bool:
    """Whether every slot expected to commit ``MIN_SLOT_GAIN`` raises the batch's tokens per second
    whatever else the step forwards, so that the best choice is every such slot, with no sort: the
    common case.

    Either every window whole fits below the knee (rows cost nothing: a small batch), or rows cost
    next to nothing (a host-bound model). A slot of gain g added to a step of gain G and cost C at
    a row cost of at most ``per_row`` raises G / C when g * C > per_row * G; with g at least
    ``MIN_SLOT_GAIN``, C at least ``fixed`` and G at most one token per slot of every window, that
    holds when ``MIN_SLOT_GAIN * fixed > per_row * batch * max_window``, asked here with a factor 2
    to spare for rounding."""
    if run_rows + batch * max_window <= cost.knee:
        return True
    return 2 * cost.per_row * batch * max_window < MIN_SLOT_GAIN * cost.fixed


def best_windows(reaches: list[list[float]], cost: StepCost,
                 run_rows: float | None = None) -> tuple[list[int], float, float]:
    """The W of each request's next window that maximises the batch's expected committed tokens
    per second, with the tokens those windows are expected to commit and the rows they forward.

    ``reaches``: each request's (``update_reach``), of one length (the largest window);
    ``run_rows``: the rows the windows' leading runs add to the step (default: ``expected_run``).
    Every window gets one slot; the others go in order of gain (a request's slots in order, the
    gains being decreasing), as many as tokens per second keep rising: the gains fall and the cost
    is convex in rows, so the rate along that order rises to its peak and then falls (the first
    fall ends the search; of equal rates the fewest rows win)."""
    if run_rows is None:
        run_rows = expected_run(reaches)
    gains = [usable_gains(reach) for reach in reaches]
    if reaches and every_usable_slot_pays(cost, len(reaches), len(reaches[0]), run_rows):
        sizes = [len(usable) for usable in gains]
        return sizes, sum(sum(usable) for usable in gains), run_rows + sum(sizes)
    return best_prefix(gains, cost, run_rows)


def best_prefix(gains: list[list[float]], cost: StepCost, run_rows: float) -> tuple[list[int], float, float]:
    """``best_windows`` by its definition, without the short cut: every window one slot, then the
    others (each request's ``usable_gains``, ``gains``) in order of gain while the rate rises."""
    commits, rows = sum(usable[0] for usable in gains), run_rows + len(gains)
    # Every slot past each window's first, by gain; a stable sort keeps a request's equal gains in
    # slot order, so each request's slots are taken as a prefix of its window.
    extra = sorted(((gain, request) for request, usable in enumerate(gains) for gain in usable[1:]),
                   key=lambda slot: slot[0], reverse=True)
    best_rate, taken = commits / cost.seconds(rows), 0
    for gain, _ in extra:
        rate = (commits + gain) / cost.seconds(rows + 1)
        if rate <= best_rate:
            break
        best_rate, commits, rows, taken = rate, commits + gain, rows + 1, taken + 1
    sizes = [1] * len(gains)
    for _, request in extra[:taken]:
        sizes[request] += 1
    return sizes, commits, rows


def choose_window_sizes(reaches: list[list[float]], cost: StepCost, run_rows: float | None = None) -> list[int]:
    """Each request's W in [1, W] for its next window (``best_windows``)."""
    return best_windows(reaches, cost, run_rows)[0]


def zero_windows(sizes: list[int], reaches: list[list[float]], eligible: list[bool]) -> list[int]:
    """``sizes`` (``choose_window_sizes``'), with W 0 for each ``eligible`` request whose window is
    expected to commit at most one token: a window of W 0 forwards no mask row and commits exactly
    one token (its leading run's next token, drawn from the run's last row), so it commits as much
    for fewer rows, and the batch's tokens per second can only rise. (A window of W 1 never beats
    it: its one slot commits at most one token.) Per request, on the engine whose rows are the
    requests' own (fixed window rows); the choice among windows stays ``best_windows``'."""
    return [0 if ok and sum(usable_gains(reach)[:size]) <= 1.0 else size
            for size, reach, ok in zip(sizes, reaches, eligible, strict=True)]


def choose_step(reaches: list[list[float]], cost: StepCost, ar_step: float,
                run_rows: float | None = None) -> list[int]:
    """Each request's W in [0, W]: ``best_windows``, or W 0 for every request (an AR step of the
    whole batch) where that is expected to commit more tokens per second.

    ``ar_step``: the seconds of an AR step of this batch (vLLM's own step, which commits one token per
    request whatever the text). On a host-bound model a window step costs more than an AR step (its
    mask rows, its host work), so where windows commit about one token per forward (uncertain text)
    AR is faster; a tie goes to AR, the cheaper step to run. The choice is the batch's, not each
    request's: the saving comes from the step being vLLM's whole (no window of any request)."""
    if not reaches:
        return []
    sizes, commits, rows = best_windows(reaches, cost, run_rows)
    return [0] * len(reaches) if len(reaches) / ar_step >= commits / cost.seconds(rows) else sizes
