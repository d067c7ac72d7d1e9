"""The scheduler's half of the adaptive window: what each WeDLM request's windows committed, and the
W of every window a step plans (``core/window_policy.py`` chooses it).

The scheduler decides W because it decides the rows: with fixed window rows it schedules a window's
rows from its W (2W padded, or W and a predicted run) before the runner has planned it. Each step's
choice travels to the runner on the step's ``SchedulerOutput`` (``WINDOW_SIZES_ATTR``: request id ->
W), and the runner plans each window of the step (the next one of each window it forwards, the first
one after a prompt) with it. So a step's W is the W of the window the runner holds for the request
from then on, until the request's next step plans again; the scheduler keeps it (``window_of``) to
schedule that window's rows.

What a request committed is what its window steps return (the run each step decided: a plain
window's next leading run, a lossless one's verified run), counted against the W of the window
that step forwarded. Under async scheduling that comes back a step late; the estimate is a moving
average either way. A request not seen yet starts from the server's: a slower moving average of
every request's (``PRIOR_WEIGHT``), so that on a workload of uncertain text a new request does not
spend its first forwards on whole windows, which a short answer never outgrows.
"""

from __future__ import annotations

import torch

from vllm_wedlm.core.window_policy import COMMIT_AVERAGE_WEIGHT, StepCost, choose_window_sizes, update_commit_estimate

#: The ``SchedulerOutput`` attribute that carries a step's window sizes to the runner (a plain
#: attribute of vLLM's dataclass: it travels with the object, pickled to other worker processes).
WINDOW_SIZES_ATTR = "wedlm_window_sizes"
#: The W of each window the step forwards, for the scheduler's count of its commits.
FORWARDED_SIZES_ATTR = "wedlm_forwarded_window_sizes"
#: Weight of each request's estimate, after each of its forwards, in the server's (a new request's start).
PRIOR_WEIGHT = COMMIT_AVERAGE_WEIGHT / 8


class WindowSizer:
    def __init__(self, max_window: int, cost: StepCost):
        self.max_window, self.cost = max_window, cost
        self.estimates: dict[str, float] = {}  # req_id -> commits per forward (core.window_policy)
        self.prior = float(max_window)  # a new request's estimate: the server's moving average
        self.planned: dict[str, int] = {}  # req_id -> W of the window the runner holds (or plans now)

    def window_of(self, req_id: str) -> int:
        """W of the window the runner holds for ``req_id`` (the most before its first plan)."""
        return self.planned.get(req_id, self.max_window)

    def assign(self, scheduler_output, planning: list[str]) -> dict[str, int]:
        """Choose W for each window the step plans (the requests ``planning``: every window it
        forwards and every prompt it completes), attach the choice to ``scheduler_output`` and return
        it. A request not seen yet starts from the server's estimate (``prior``)."""
        estimate = torch.tensor([self.estimates.get(req_id, self.prior) for req_id in planning], dtype=torch.float32)
        chosen = dict(zip(planning, choose_window_sizes(estimate, self.max_window, self.cost).tolist(), strict=True))
        # The window a step forwards was planned by the request's step before (a first window riding
        # with its prompt, by this one).
        setattr(scheduler_output, FORWARDED_SIZES_ATTR,
                {req_id: self.planned.get(req_id, chosen[req_id]) for req_id in planning})
        self.planned.update(chosen)
        setattr(scheduler_output, WINDOW_SIZES_ATTR, chosen)
        return chosen

    def observe(self, scheduler_output, runs: dict[str, int]) -> None:
        """Count what the windows of a finished step committed (``runs``: request id -> tokens
        returned, for the requests whose window it forwarded)."""
        forwarded = getattr(scheduler_output, FORWARDED_SIZES_ATTR, {})
        for req_id in runs.keys() & forwarded.keys():
            value = update_commit_estimate(self.estimates.get(req_id, self.prior), runs[req_id], forwarded[req_id])
            self.estimates[req_id] = value
            self.prior += PRIOR_WEIGHT * (value - self.prior)

    def forget(self, req_id: str) -> None:
        """A request finished or was aborted."""
        self.estimates.pop(req_id, None)
        self.planned.pop(req_id, None)
