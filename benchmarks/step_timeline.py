"""Where each engine step's host time goes, over the course of a run (engine core in this process).

Under async scheduling a step costs the longer of its forward and the host's work between two
launches, and the host's work is invisible to a profiler of kernels. This times every iteration of
vLLM's engine-core loop, unprofiled: how long it took to schedule, to launch the forward
(``execute_model``: the runner's input preparation and the graph launch), to launch sampling, to
wait for the step in flight (``AsyncOutputFuture.result``: the GPU's time the host did not cover),
and to update the scheduler from that step. The run's iterations are cut into ``parts`` equal
slices, so a slowdown late in the requests shows where it is and in which part of the loop.

``sync_sites``: with ``sync_debug``, torch reports every operation that makes the host wait for
the GPU (``torch.cuda.set_sync_debug_mode``); each is counted by its call site in this project's
or vLLM's code, per slice. Under async scheduling any such wait in the loop serialises host and GPU.
"""

from __future__ import annotations

import itertools
import time
import traceback
import warnings
from collections import defaultdict

PHASES = ("schedule", "execute", "sample", "wait", "update")


class _Clock:
    """Seconds per phase of the current iteration; ``iterations`` collects them."""

    def __init__(self):
        self.iterations: list[dict[str, float]] = []
        self.current: dict[str, float] | None = None

    def timed(self, phase: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.current is not None:
                    self.current[phase] = self.current.get(phase, 0.0) + time.perf_counter() - start
        return wrapper

    def iteration(self, fn):
        def wrapper(*args, **kwargs):
            self.current = {"start": time.perf_counter()}
            try:
                return fn(*args, **kwargs)
            finally:
                self.current["total"] = time.perf_counter() - self.current["start"]
                self.iterations.append(self.current)
                self.current = None
        return wrapper


def _call_site(stack: traceback.StackSummary) -> str:
    """The innermost frame of this project or of vLLM (not torch's, not this module's)."""
    for frame in reversed(stack):
        name = frame.filename.replace("\\", "/")
        if ("/vllm_wedlm/" in name or "/vllm/" in name) and not name.endswith("step_timeline.py"):
            short = name[name.rfind("/vllm"):]
            return f"{short}:{frame.lineno} {frame.name}"
    return "elsewhere"


def timeline(llm, run, parts: int = 8, sync_debug: bool = False) -> dict:
    """Time ``run()`` (one ``llm.generate``) iteration by iteration; the summary per slice."""
    import torch
    from vllm.v1.executor import uniproc_executor

    core = llm.llm_engine.engine_core.engine_core
    clock = _Clock()
    scheduler, executor = core.scheduler, core.model_executor
    saved = {"schedule": scheduler.schedule, "update": scheduler.update_from_output,
             "execute": executor.execute_model, "sample": executor.sample_tokens, "step_fn": core.step_fn}
    future_result = uniproc_executor.AsyncOutputFuture.result
    scheduler.schedule = clock.timed("schedule", saved["schedule"])
    scheduler.update_from_output = clock.timed("update", saved["update"])
    executor.execute_model = clock.timed("execute", saved["execute"])
    executor.sample_tokens = clock.timed("sample", saved["sample"])
    core.step_fn = clock.iteration(saved["step_fn"])
    uniproc_executor.AsyncOutputFuture.result = clock.timed("wait", future_result)
    sites: dict[str, list[int]] = defaultdict(list)  # call site -> iteration index per sync
    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            sites[_call_site(traceback.extract_stack())].append(len(clock.iterations))
        else:
            show(message, category, filename, lineno, file, line)

    try:
        if sync_debug:
            warnings.showwarning = record
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        run()
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = show
        scheduler.schedule, scheduler.update_from_output = saved["schedule"], saved["update"]
        executor.execute_model, executor.sample_tokens = saved["execute"], saved["sample"]
        core.step_fn = saved["step_fn"]
        uniproc_executor.AsyncOutputFuture.result = future_result
    return summarize(clock.iterations, parts, sites)


def summarize(iterations: list[dict[str, float]], parts: int, sites: dict[str, list[int]] | None = None) -> dict:
    """Per slice of the iterations: their count, how many launched a forward, the wall time per
    launched forward (first start to last end of the slice over the forwards), and each phase's
    milliseconds per iteration (``other``: the loop's own work; ``between``: outside the loop, the
    frontend's output processing in this process); the sync sites' counts per slice."""
    n = len(iterations)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    spans = list(itertools.pairwise(bounds))  # [lo, hi) of each slice
    slices = []
    for lo, hi in spans:
        chunk = iterations[lo:hi]
        if not chunk:
            continue
        forwards = sum(1 for it in chunk if "execute" in it)
        wall = chunk[-1]["start"] + chunk[-1]["total"] - chunk[0]["start"]
        phases = {p: sum(it.get(p, 0.0) for it in chunk) for p in PHASES}
        # Inside the loop but in none of the phases; outside it (the frontend's output processing).
        phases["other"] = sum(it["total"] for it in chunk) - sum(phases.values())
        phases["between"] = wall - sum(it["total"] for it in chunk)
        slices.append({"iterations": len(chunk), "forwards": forwards,
                       "wall_ms_per_forward": round(wall * 1e3 / max(forwards, 1), 3),
                       **{f"{p}_ms": round(t * 1e3 / len(chunk), 3) for p, t in phases.items()}})
    summary = {"iterations": n, "slices": slices}
    if sites:
        summary["sync_sites"] = {site: [sum(1 for i in hits if lo <= i < hi) for lo, hi in spans]
                                 for site, hits in sorted(sites.items(), key=lambda kv: -len(kv[1]))}
    return summary
