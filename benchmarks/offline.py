"""Offline measurements through ``vllm.LLM``: each batch submitted at once, per mode and task kind."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import numpy as np

from benchmarks.modes import Mode, by_engine, runner_env, token_budget
from benchmarks.workload import STRUCTURED, Prompt, score, take
from vllm_wedlm.engine_settings import engine_kwargs
from vllm_wedlm.evaluation import (
    graph_modes,
    graph_modes_since,
    request_forwards,
    start_window_trace,
    window_histogram,
    window_steps,
    window_steps_since,
)

#: Requests of a batch-1 point, run one at a time: a single request is one question's few forwards.
BATCH1_REQUESTS = 16


def engine_scheduling(llm) -> dict[str, str]:
    """How a WeDLM engine ran: vLLM's scheduling (async or sync, as resolved from the flags and the
    platform) and its window rows (fixed: laid out on the device; exact: from the host)."""
    config = llm.llm_engine.vllm_config
    fixed = (config.additional_config or {}).get("fixed_window_rows", False)
    return {"scheduling": "async" if config.scheduler_config.async_scheduling else "sync",
            "window_rows": "fixed" if fixed else "exact"}


def engine_settings(mode: Mode, window_size: int | None, max_batch: int, overrides: dict[str, Any],
                    window_tokens: int | None = None) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments of a mode's engine; the same for every mode but the mode's own."""
    settings = engine_kwargs(**overrides)
    settings["additional_config"] = mode.additional_config(window_size, window_tokens)
    settings["max_num_seqs"] = max_batch
    # Every WeDLM window of a full batch fits one step, whatever the mode.
    settings.setdefault("max_num_batched_tokens", token_budget(max_batch, mode.widest_window(window_size)))
    if mode.scheduling:
        settings["async_scheduling"] = mode.scheduling == "async"
    if mode.ngram_tokens:
        settings["speculative_config"] = mode.speculative_config()
        settings["disable_log_stats"] = False  # the accepted-token counter tells forwards apart
    return settings


class ForwardCounter:
    """Decoding forwards of an engine so far, as a function of the tokens it produced."""

    def __init__(self, llm, mode: Mode):
        self.llm, self.mode = llm, mode

    def snapshot(self) -> int:
        if self.mode.windows:
            return request_forwards(self.llm)  # windows forwarded
        if self.mode.ngram_tokens:  # each forward yields one token plus the drafts it accepted
            return -sum(m.value for m in self.llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens")
        return 0

    def forwards(self, before: int, after: int, output_tokens: int) -> int:
        if self.mode.windows:
            return after - before
        return output_tokens + (after - before)  # AR: one per token, minus accepted drafts


def sampling_params(mode: Mode, max_tokens: int, ignore_eos: bool, structured: str = "none"):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    constraint = STRUCTURED[structured]
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                          extra_args=mode.extra_args(),
                          structured_outputs=StructuredOutputsParams(**constraint) if constraint else None)


def run(model: str, modes: list[Mode], workloads: dict[int, dict[str, list[Prompt]]], *, batch_sizes: list[int],
        max_tokens: list[int], ignore_eos: bool, window_size: int | None,
        engine_overrides: dict[str, Any], progress, repeats: int = 1, window_tokens: int | None = None,
        interleave: bool = False, structured: tuple[str, ...] = ("none",)) -> list[dict]:
    """One row per mode x shots x max_tokens x batch size x task kind (``workloads``: by shots), each
    timed ``repeats`` times (median seconds and spread; greedy outputs are the same every time).

    Point by point, every repeat times each mode of an engine in turn. With ``interleave`` every
    mode's engine is started first and stays up, so a point's repeats alternate between all modes:
    a machine whose speed drifts over minutes (seen on the GPU machine: AR alone -40% in 15 minutes)
    then moves every mode alike, and the ratios hold. It needs the memory of all engines at once."""
    from vllm import LLM

    settings = [(shots, kind, prompts, limit, batch_size, constraint) for shots, workload in workloads.items()
                for limit in max_tokens for batch_size in batch_sizes for kind, prompts in workload.items()
                for constraint in structured]
    measure = _Measurement(settings, len(modes) * len(settings), repeats, ignore_eos, window_size, window_tokens,
                           progress)
    with ExitStack() as stack:
        live = []  # with interleave: (modes, vllm.LLM) of every engine, all up
        for group in by_engine(modes).values():
            engine = ExitStack()
            stack.callback(engine.close)  # a failure anywhere still stops every engine
            with runner_env(group[0]):
                llm = LLM(model, **engine_settings(group[0], window_size, max(batch_sizes), engine_overrides,
                                                   window_tokens))
            engine.callback(llm.llm_engine.engine_core.shutdown)
            warm = take(settings[0][2], max(batch_sizes))
            llm.generate([p.text for p in warm], sampling_params(group[0], 16, True), use_tqdm=False)
            if interleave:
                live.append((group, llm))
            else:
                measure.run([(group, llm)])
                engine.close()
        measure.run(live)
    return measure.rows


class _Measurement:
    """The rows of every point, timed for the engines given to ``run``."""

    def __init__(self, settings: list, total: int, repeats: int, ignore_eos: bool, window_size: int | None,
                 window_tokens: int | None, progress):
        self.settings, self.total, self.repeats, self.progress = settings, total, repeats, progress
        self.ignore_eos, self.window_size, self.window_tokens = ignore_eos, window_size, window_tokens
        self.rows: list[dict] = []

    def run(self, engines: list[tuple[list[Mode], Any]]) -> None:
        """Every point for the modes of ``engines`` ((modes, their vllm.LLM) pairs)."""
        runs = [(mode, llm, ForwardCounter(llm, mode)) for group, llm in engines for mode in group]
        for shots, kind, prompts, limit, batch_size, structured in self.settings:
            one_at_a_time = batch_size == 1
            batch = take(prompts, BATCH1_REQUESTS if one_at_a_time else batch_size)
            times: dict[str, list[float]] = {mode.name: [] for mode, _, _ in runs}
            forwards = dict.fromkeys(times, 0)
            steps: dict[str, dict[str, int]] = {name: {} for name in times}  # WeDLM: steps per graph mode
            plain_steps = {name: {"compiled": 0, "eager": 0} for name in times}  # WeDLM: window step runs
            histograms: dict[str, dict[str, int]] = {}  # an adaptive window's W: windows planned at each
            outputs = {}
            scores: dict[str, list[float | None]] = {name: [] for name in times}  # each repeat's accuracy
            for repeat in range(self.repeats):
                for mode, llm, counter in runs:
                    # The W of every window an adaptive engine plans, recorded in the last repeat.
                    traced = mode.windows and mode.window_settings(self.window_size, self.window_tokens)[
                        "adaptive_window"] and repeat == self.repeats - 1
                    if traced:
                        start_window_trace(llm)
                    params = sampling_params(mode, limit, self.ignore_eos, structured)
                    before = counter.snapshot()
                    modes_before = graph_modes(llm) if mode.decoding == "wedlm" else {}
                    plain_before = window_steps(llm) if mode.decoding == "wedlm" else {}
                    start = time.perf_counter()
                    if one_at_a_time:  # each request alone, the next once it finished
                        outputs[mode.name] = [llm.generate([p.text], params, use_tqdm=False)[0] for p in batch]
                    else:
                        outputs[mode.name] = llm.generate([p.text for p in batch], params, use_tqdm=False)
                    times[mode.name].append(time.perf_counter() - start)
                    if structured != "json":  # (a JSON answer states no "The answer is N.": not scored)
                        scores[mode.name].append(score(batch, [o.outputs[0].text for o in outputs[mode.name]]))
                    if traced:
                        histograms[mode.name] = window_histogram(llm)
                    tokens = sum(len(o.outputs[0].token_ids) for o in outputs[mode.name])
                    forwards[mode.name] += counter.forwards(before, counter.snapshot(), tokens)
                    if mode.decoding == "wedlm":
                        for graph, count in graph_modes_since(llm, modes_before).items():
                            steps[mode.name][graph] = steps[mode.name].get(graph, 0) + count
                        for how, count in window_steps_since(llm, plain_before).items():
                            plain_steps[mode.name][how] += count
            for mode, llm, _ in runs:
                self._row(mode, shots, kind, limit, batch_size, batch, outputs[mode.name], times[mode.name],
                          forwards[mode.name] / self.repeats, steps[mode.name], plain_steps[mode.name],
                          engine_scheduling(llm) if mode.decoding == "wedlm" else {}, histograms.get(mode.name),
                          structured, scores[mode.name])

    def _row(self, mode: Mode, shots: int, kind: str, limit: int, batch_size: int, batch: list[Prompt], outputs,
             times: list[float], forwards: float, steps: dict[str, int], plain_steps: dict[str, int],
             scheduling: dict[str, str], histogram: dict[str, int] | None = None, structured: str = "none",
             scores: list[float | None] = ()) -> None:
        seconds = float(np.median(times))
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        wedlm = mode.decoding == "wedlm"
        row = {
            "mode": mode.name, "kind": kind, "batch_size": batch_size, "shots": shots,
            "max_tokens": limit, **mode.window_settings(self.window_size, self.window_tokens),
            "requests": len(outputs),
            "prompt_tokens": round(sum(len(o.prompt_token_ids) for o in outputs) / len(outputs), 1),
            "output_tokens": tokens, "seconds": round(seconds, 4),
            "seconds_spread": [round(min(times), 4), round(max(times), 4)], "repeats": self.repeats,
            "output_tok_s": round(tokens / seconds, 2),
            "tokens_per_forward": round(tokens / forwards, 3) if forwards else None,
            # The last repeat's, and every repeat's: a plain adaptive window's output follows the load,
            # so its answers may differ between repeats (AR's and lossless' never do).
            "accuracy": scores[-1] if scores else None,
            "accuracy_repeats": list(scores) if scores and scores[0] is not None else None,
            "structured": None if structured == "none" else structured,
        }
        if wedlm:
            row.update(scheduling)
            row["graph_modes"] = steps
            row["window_steps"] = plain_steps  # steps of plain windows: device work compiled / eager
            if histogram is not None:
                row["window_histogram"] = histogram  # W: windows planned
        self.rows.append(row)
        self.progress(len(self.rows), self.total, row)
