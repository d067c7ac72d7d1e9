"""Offline measurements through ``vllm.LLM``: each batch submitted at once, per mode and task kind."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.modes import Mode, by_engine, token_budget
from benchmarks.stats import accuracy
from benchmarks.workload import Prompt, take
from vllm_wedlm.evaluation import graph_modes, graph_modes_since, request_forwards
from vllm_wedlm.testing import engine_kwargs


def engine_settings(mode: Mode, window_size: int, max_batch: int, overrides: dict[str, Any],
                    window_tokens: int | None = None) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments of a mode's engine; the same for every mode but the mode's own."""
    settings = engine_kwargs(**overrides)
    settings["additional_config"] = mode.additional_config(window_size, window_tokens)
    settings["max_num_seqs"] = max_batch
    # Every WeDLM window of a full batch fits one step, whatever the mode.
    settings.setdefault("max_num_batched_tokens", token_budget(max_batch, window_size))
    if mode.ngram_tokens:
        settings["speculative_config"] = mode.speculative_config()
        settings["disable_log_stats"] = False  # the accepted-token counter tells forwards apart
    return settings


class ForwardCounter:
    """Decoding forwards of an engine so far, as a function of the tokens it produced."""

    def __init__(self, llm, mode: Mode):
        self.llm, self.mode = llm, mode

    def snapshot(self) -> int:
        if self.mode.decoding == "wedlm":
            return request_forwards(self.llm)  # windows forwarded
        if self.mode.ngram_tokens:  # each forward yields one token plus the drafts it accepted
            return -sum(m.value for m in self.llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens")
        return 0

    def forwards(self, before: int, after: int, output_tokens: int) -> int:
        if self.mode.decoding == "wedlm":
            return after - before
        return output_tokens + (after - before)  # AR: one per token, minus accepted drafts


def sampling_params(mode: Mode, max_tokens: int, ignore_eos: bool):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                          extra_args=mode.extra_args())


def run(model: str, modes: list[Mode], workloads: dict[int, dict[str, list[Prompt]]], *, batch_sizes: list[int],
        max_tokens: list[int], ignore_eos: bool, window_size: int,
        engine_overrides: dict[str, Any], progress, repeats: int = 1, window_tokens: int | None = None) -> list[dict]:
    """One row per mode x shots x max_tokens x batch size x task kind (``workloads``: by shots), each
    timed ``repeats`` times (median seconds and spread; greedy outputs are the same every time)."""
    from vllm import LLM

    rows = []
    settings = [(shots, kind, prompts, limit, batch_size) for shots, workload in workloads.items()
                for limit in max_tokens for batch_size in batch_sizes for kind, prompts in workload.items()]
    total = len(modes) * len(settings)
    for group in by_engine(modes).values():
        llm = LLM(model, **engine_settings(group[0], window_size, max(batch_sizes), engine_overrides, window_tokens))
        try:
            warm = take(settings[0][2], max(batch_sizes))
            llm.generate([p.text for p in warm], sampling_params(group[0], 16, True), use_tqdm=False)
            for mode in group:
                counter = ForwardCounter(llm, mode)
                for shots, kind, prompts, limit, batch_size in settings:
                    params = sampling_params(mode, limit, ignore_eos)
                    batch = take(prompts, batch_size)
                    before = counter.snapshot()
                    modes_before = graph_modes(llm) if mode.decoding == "wedlm" else {}
                    times = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        outputs = llm.generate([p.text for p in batch], params, use_tqdm=False)
                        times.append(time.perf_counter() - start)
                    seconds = float(np.median(times))
                    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                    forwards = counter.forwards(before, counter.snapshot(), tokens * repeats) / repeats
                    row = {
                        "mode": mode.name, "kind": kind, "batch_size": batch_size, "shots": shots,
                        "max_tokens": limit, "window_size": window_size if mode.decoding == "wedlm" else None,
                        "window_tokens": window_tokens if mode.decoding == "wedlm" else None,
                        "requests": len(outputs),
                        "prompt_tokens": round(sum(len(o.prompt_token_ids) for o in outputs) / len(outputs), 1),
                        "output_tokens": tokens, "seconds": round(seconds, 4),
                        "seconds_spread": [round(min(times), 4), round(max(times), 4)], "repeats": repeats,
                        "output_tok_s": round(tokens / seconds, 2),
                        "tokens_per_forward": round(tokens / forwards, 3) if forwards else None,
                        "accuracy": accuracy([p.score(o.outputs[0].text) for p, o in zip(batch, outputs, strict=True)]),
                    }
                    if mode.decoding == "wedlm":
                        row["graph_modes"] = graph_modes_since(llm, modes_before)
                    rows.append(row)
                    progress(len(rows), total, row)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    return rows
