"""The scheduler's half of the adaptive window: what each WeDLM request's windows committed, and the
W of every window a step plans (``core/window_policy.py`` chooses it).

The scheduler decides W because it decides the rows: with fixed window rows it schedules a window's
rows from its W (2W padded, or W and a predicted run) before the runner has planned it. Each step's
choice travels to the runner in the step's plan (``protocol.WeDLMStepPlan.window_sizes``: request id ->
W), and the runner plans each window of the step (the next one of each window it forwards, the first
one after a prompt) with it. So a step's W is the W of the window the runner holds for the request
from then on, until the request's next step plans again; the scheduler keeps it (``window_of``) to
schedule that window's rows.

What a request committed is what its window steps return (the run each step decided: a plain
window's next leading run, a lossless one's verified run), counted against the W of the window
that step forwarded (its ``reach``, ``core.window_policy.update_reach``). Under async scheduling
that comes back a step late; the reach is a moving average either way. A request not seen yet
starts from the server's: a slower moving average of every request's (``PRIOR_WEIGHT``), so that
on a workload of uncertain text a new request does not spend its first forwards on whole windows,
which a short answer never outgrows.

**W 0: AR steps** (``core.window_policy.choose_step``). On the synchronous engine (exact rows) the
scheduler asks ``steps_ar`` before each schedule whether the whole batch should take an AR step:
vLLM's own step, one token per request, at the cost the engine measured for its AR steps
(``StepTimes``: the seconds of its own steps, AR and windowed, per batch-size class). A W 0 step
observes nothing of what windows would commit, so every few AR steps two window steps of whole
windows re-measure (a probe; the gap doubles while AR keeps winning).

**W 0 on fixed window rows: a window's own** (``core.window_policy.zero_windows``). The async
engine's steps cannot be handed to vLLM whole, but each request's rows are its own: a window of W 0
is its leading run alone, one row a step once it is at W 0, which draws the next token from the
run's last row (lab notebook 5.33). The scheduler says which requests may take it (``assign``'s
``zero_ok``: the window forwarded now has at most one slot after its run and the step is padded, so
that the step commits at least one token for W 0 to draw from); each such request probes on its own
(a whole window after ``PROBE_GAP`` windows of W 0, the gap doubling up to ``MAX_PROBE_GAP``, or
further where probes' rows cost: ``longest_zero_gap``), in
the steps of a common clock (``ZERO_PROBE_PERIOD``), and W 0 forwards leave its reach as it was.
The runner reports each planned window's slots after its run (``WeDLMRunnerOutput.window_spans``),
so that a request whose probe filled nothing past its run is back at W 0 two steps later.

**Pinned requests** (``config.REQUEST_WINDOW_SIZE``): a request that pins its W gets it for every
window, probes and W 0 included (never an AR step of the batch while it runs, never a window of W 0):
its tokens then depend on its prompt and settings alone, as on a server of that fixed W. What its
windows commit still counts in the server's reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from vllm_wedlm.core.window_policy import (
    REACH_WEIGHT,
    StepCost,
    choose_step,
    choose_window_sizes,
    full_reach,
    update_reach,
    zero_windows,
)

#: Weight of each request's reach, after each of its forwards, in the server's (a new request's start);
#: a step moves the server's reach toward its requests' mean once, by the weight of that many forwards.
PRIOR_WEIGHT = REACH_WEIGHT / 8
#: An AR step's seconds against a window step's of one-slot windows (two rows a request) until the
#: engine has timed its own: on the trained ``small`` model such a window step costs 1.4-2x an AR
#: step (lab notebook 5.24), on the Qwen3-8B shape at batch 1 about 1.15x.
AR_STEP_PRIOR = 0.7
#: Weight of a step's seconds in the moving averages of ``StepTimes``.
STEP_TIME_WEIGHT = 0.2
#: AR steps before a window step re-measures what windows commit; doubled while AR still wins, up to
#: the most. A probe's windows are whole (the server's W): a shorter one cannot see a run longer than
#: itself, and a run of the whole window is what makes text like counting pay (its runs: nothing,
#: one token, or 12 to 16; lab notebook 5.29). Timed on an H200 in lab notebook 5.37.3 (5.29 ran W 4).
PROBE_GAP, MAX_PROBE_GAP = 4, 64
#: A request at W 0 on fixed window rows probes (``WindowSizer._zero_windows``) only in steps whose
#: count is a multiple of this, once its own gap has passed: the probes of a batch then fall in the
#: same few steps, and the steps between forward windows of W 0 alone, which skip the window step
#: (its host work is what a step of the async engine cannot hide at batch 64; lab notebook 5.37.6).
ZERO_PROBE_PERIOD = 16
#: Where a probe's rows cost (a compute-bound batch), a request at W 0 doubles its gap past
#: ``MAX_PROBE_GAP`` until its probes, a whole window's mask rows each at the step-cost curve's price,
#: take at most this share of the time of its own W 0 windows (``WindowSizer.longest_zero_gap``), up
#: to ``MAX_ZERO_PROBE_GAP`` windows. On the Qwen3-8B shape at batch 64 a probe's 16 rows cost 0.34 ms
#: against a request's 0.064 ms share of a step of W 0 windows: a gap of 269 windows. At gaps of at most 64 the probes
#: were most of what kept that batch from 0.9x AR (lab notebook 5.37.6). Where rows are free (below the
#: knee, a host-bound model) the gap stays at most ``MAX_PROBE_GAP``.
MAX_PROBE_SHARE, MAX_ZERO_PROBE_GAP = 0.02, 1024
#: Window steps of a probe: a lossless request that held no window forwards only the token its AR step
#: returned in the first (its window starts with the token drawn from that row), its window in the next.
PROBE_STEPS = 2


@dataclass
class StepTimes:
    """Moving averages of the seconds of the engine's own decode steps (no prefill in them), per
    class of batch size (its bit length: 1, 2-3, 4-7, ...): AR steps, and window steps with the rows
    they forwarded. Measured, not modelled: a host-bound model's steps are mostly host work, which no
    FLOP count predicts."""

    ar: dict[int, float] = field(default_factory=dict)  # batch class -> seconds
    window: dict[int, tuple[float, float]] = field(default_factory=dict)  # batch class -> (seconds, rows)

    def record(self, batch: int, seconds: float, rows: int | None) -> None:
        """A decode step of ``batch`` requests took ``seconds``: an AR step (``rows`` None) or a window
        step of ``rows`` rows."""
        key = batch.bit_length()
        if rows is None:
            old = self.ar.get(key, seconds)
            self.ar[key] = old + STEP_TIME_WEIGHT * (seconds - old)
        else:
            old_seconds, old_rows = self.window.get(key, (seconds, rows))
            self.window[key] = (old_seconds + STEP_TIME_WEIGHT * (seconds - old_seconds),
                                old_rows + STEP_TIME_WEIGHT * (rows - old_rows))

    def costs(self, batch: int, model: StepCost, ar_step_cost: float | None) -> tuple[StepCost, float]:
        """The window steps' cost curve for a batch of ``batch`` requests (``model``'s shape, scaled to
        the window steps timed at this batch size) and an AR step's seconds: timed, or
        ``ar_step_cost`` (else ``AR_STEP_PRIOR``) times a window step of one-slot windows."""
        key = batch.bit_length()
        cost = model
        if key in self.window:
            seconds, rows = self.window[key]
            scale = seconds / model.seconds(rows)
            cost = replace(model, fixed=model.fixed * scale, per_row=model.per_row * scale)
        if ar_step_cost is None and key in self.ar:
            return cost, self.ar[key]
        ratio = AR_STEP_PRIOR if ar_step_cost is None else ar_step_cost
        return cost, ratio * cost.seconds(2 * batch)


class WindowSizer:
    def __init__(self, max_window: int, cost: StepCost, ar_steps: bool = False, ar_step_cost: float | None = None,
                 zero_windows: bool = False):
        self.max_window, self.cost = max_window, cost
        # Windows of W 0 per request (fixed window rows: ``core.window_policy.zero_windows``), each with
        # probes of its own: req_id -> W 0 windows since its last window, and the gap before its next probe.
        self.zero_windows = zero_windows
        self.zero_streak: dict[str, int] = {}
        self.zero_gap: dict[str, int] = {}
        self.steps = 0  # steps planned (``assign``): the probes' clock
        self.pinned: dict[str, int] = {}  # req_id -> the W it pinned (``pin``): never resized
        self.reaches: dict[str, list[float]] = {}  # req_id -> its reach [max_window] (core.window_policy)
        self.prior = full_reach(max_window)  # a new request's reach: the server's moving average
        # req_id -> W of the window the runner holds (or plans now); 0: none, the request steps AR.
        self.planned: dict[str, int] = {}
        # W 0 (``steps_ar``): allowed at all, and an AR step's fixed cost against a window step's
        # (None: timed, ``StepTimes``).
        self.ar_steps, self.ar_step_cost = ar_steps, ar_step_cost
        self.times = StepTimes()
        self.ar_streak = 0  # AR steps since the last window step
        self.probe_gap = PROBE_GAP
        self.probing = False  # the step being scheduled is a probe
        self.probe_steps = 0  # window steps of the probe still to come after this one
        # The requests ``steps_ar`` last asked about and, where windows won, the W it chose for each
        # (``assign`` takes them for the same requests: the choice is the batch's, and costs a sort).
        self.asked: tuple[str, ...] = ()
        self.sizes_hint: dict[str, int] = {}

    def pin(self, req_id: str, window_size: int) -> None:
        """``req_id`` keeps windows of ``window_size`` (at most ``max_window``) until it finishes."""
        if not 1 <= window_size <= self.max_window:
            raise ValueError(f"a pinned W must be in [1, {self.max_window}], got {window_size}")
        self.pinned[req_id] = window_size

    def window_of(self, req_id: str) -> int:
        """W of the window the runner holds for ``req_id`` (the most, or its pin, before its first plan)."""
        planned = self.planned.get(req_id)
        return self.pinned.get(req_id, self.max_window) if planned is None else planned

    def holds_window(self, req_id: str) -> bool:
        """Whether the runner holds a window for ``req_id`` (planned, and not dropped by an AR step)."""
        return bool(self.planned.get(req_id))

    def steps_ar(self, req_ids: list[str]) -> bool:
        """Whether the next step should be an AR step of the running WeDLM requests ``req_ids``
        (``core.window_policy.choose_step``, at the step costs timed at this batch size), unless it
        is time for a window step to re-measure what windows commit (a probe)."""
        self.probing, self.sizes_hint = False, {}
        if not self.ar_steps or not req_ids or (self.pinned and not self.pinned.keys().isdisjoint(req_ids)):
            return False  # (an AR step is W 0 for every request of the batch, a pinned one's too)
        if self.probe_steps:
            self.probe_steps -= 1
            self.probing = True
            return False
        asked, self.asked = self.asked, tuple(req_ids)
        # While AR steps run, reaches do not move (nothing is observed): the same requests get the
        # same answer, without the policy's host work, until a probe or a change of the batch.
        if not (self.ar_streak and asked == self.asked):
            reaches = [self.reaches.get(r, self.prior) for r in req_ids]
            cost, ar_step = self.times.costs(len(req_ids), self.cost, self.ar_step_cost)
            sizes = choose_step(reaches, cost, ar_step)
            if any(sizes):
                self.probe_gap, self.ar_streak = PROBE_GAP, 0  # windows win: they are measured as they run
                self.sizes_hint = dict(zip(req_ids, sizes, strict=True))
                return False
        if self.ar_streak >= self.probe_gap:
            self.probing, self.ar_streak, self.probe_steps = True, 0, PROBE_STEPS - 1
            self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_GAP)
            return False
        self.ar_streak += 1
        return True

    def assign(self, planning: list[str], stepping_ar: list[str] = (),
               zero_ok: set[str] | frozenset = frozenset()) -> tuple[dict[str, int], dict[str, int]]:
        """Choose W for each window the step plans (the requests ``planning``: every window it
        forwards and every prompt it completes) and W 0 for the requests ``stepping_ar`` (an AR step).
        Returns the choice (request id -> W, the step plan's ``window_sizes``) and the W of each window
        the step forwards (its ``forwarded_sizes``, for ``observe``). A request not seen yet starts from
        the server's reach (``prior``). With ``zero_windows``, the requests ``zero_ok`` may plan a
        window of W 0 (``_zero_windows``)."""
        self.steps += 1
        reaches = [self.reaches.get(r, self.prior) for r in planning]
        if planning and self.sizes_hint.keys() == set(planning):  # chosen by ``steps_ar`` for this batch
            sizes = [self.sizes_hint[req_id] for req_id in planning]
        else:
            sizes = choose_window_sizes(reaches, self.cost)
        if self.probing:  # the whole window: what windows would commit, long runs included
            sizes = [self.max_window] * len(sizes)
        if self.zero_windows:
            sizes = self._zero_windows(planning, reaches, sizes, zero_ok - self.pinned.keys())
        chosen = dict(zip(planning, sizes, strict=True))
        if self.pinned:
            chosen.update((req_id, self.pinned[req_id]) for req_id in self.pinned.keys() & chosen.keys())
        # The window a step forwards was planned by the request's step before (a first window riding
        # with its prompt, or a window after an AR step, by this one); a window of W 0 is its own.
        forwarded = {req_id: (self.planned.get(req_id, chosen[req_id]) if self.zero_windows
                              else self.planned.get(req_id) or chosen[req_id]) for req_id in planning}
        chosen.update(dict.fromkeys(stepping_ar, 0))
        self.planned.update(chosen)
        return chosen, forwarded

    def _zero_windows(self, planning: list[str], reaches: list[list[float]], sizes: list[int],
                      zero_ok: set[str] | frozenset) -> list[int]:
        """``sizes`` with W 0 where ``core.window_policy.zero_windows`` gives it, but for a probe: a
        request at W 0 observes no window, so after ``PROBE_GAP`` of them (doubled each time W 0 still
        wins afterwards, up to ``longest_zero_gap``) it plans one whole window instead, in the next
        step whose count is a multiple of ``ZERO_PROBE_PERIOD``."""
        zeroed = zero_windows(sizes, reaches, [req_id in zero_ok for req_id in planning])
        rows, longest = len(planning) + sum(zeroed), None  # (the longest gap: asked where a probe is due)
        for i, req_id in enumerate(planning):
            if zeroed[i]:
                if req_id in zero_ok:  # windows win where W 0 could be: they are measured as they run
                    self.zero_streak.pop(req_id, None)
                    self.zero_gap.pop(req_id, None)
                continue
            streak = self.zero_streak.get(req_id, 0) + 1
            gap = self.zero_gap.get(req_id, PROBE_GAP)
            if streak > gap and self.steps % ZERO_PROBE_PERIOD == 0:
                if longest is None:
                    longest = self.longest_zero_gap(rows, len(planning))
                zeroed[i], streak = self.max_window, 0
                self.zero_gap[req_id] = min(2 * gap, longest)
            self.zero_streak[req_id] = streak
        return zeroed

    def longest_zero_gap(self, rows: float, batch: int) -> int:
        """The most windows of W 0 between a request's probes in a step of ``rows`` rows for ``batch``
        requests: ``MAX_PROBE_GAP``, or more where a probe's mask rows cost (``MAX_PROBE_SHARE``)."""
        seconds = self.cost.seconds(rows)
        probe = self.cost.seconds(rows + self.max_window) - seconds  # a whole window's mask rows, beyond
        if probe <= 0:  # below the knee: free
            return MAX_PROBE_GAP
        share = MAX_PROBE_SHARE * seconds / batch  # the most a request's probes may take of a step
        gap = math.ceil(probe / share) if share > 0 else MAX_ZERO_PROBE_GAP
        return max(MAX_PROBE_GAP, min(gap, MAX_ZERO_PROBE_GAP))

    def observe(self, forwarded: dict[str, int], runs: dict[str, int]) -> None:
        """Count what the windows of a finished step committed (``runs``: request id -> tokens
        returned, for the requests whose window it forwarded, of the W in ``forwarded``: the step
        plan's ``forwarded_sizes``)."""
        updated = []
        # In a fixed order: a set's order follows the hash seed, and the mean's rounding with it.
        for req_id in sorted(runs.keys() & forwarded.keys()):
            if not forwarded[req_id]:  # a window of W 0 commits its one draw whatever the text
                continue
            reach = update_reach(self.reaches.get(req_id, self.prior), runs[req_id], forwarded[req_id])
            self.reaches[req_id] = reach
            updated.append(reach)
        if updated:  # once a step, toward the step's mean reach, as far as its forwards move it
            weight = 1.0 - (1.0 - PRIOR_WEIGHT) ** len(updated)
            mean = [sum(column) / len(updated) for column in zip(*updated, strict=True)]
            self.prior = [p + weight * (m - p) for p, m in zip(self.prior, mean, strict=True)]

    def forget(self, req_id: str) -> None:
        """A request finished or was aborted."""
        self.reaches.pop(req_id, None)
        self.planned.pop(req_id, None)
        self.pinned.pop(req_id, None)
        self.zero_streak.pop(req_id, None)
        self.zero_gap.pop(req_id, None)
