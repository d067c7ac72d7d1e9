"""The engine's cost: time per decoding step of WeDLM windows vs one AR step, on random weights.

A model of a real shape (default: Qwen3-8B's, WeDLM-8B's body) is built by vLLM from its config
alone (``load_format="dummy"``: random weights, no checkpoint), so only the cost of a step is
measured, not what a trained model would commit. Two WeDLM settings per window size W:

* ``wedlm:inf``: every mask fills each step, so a window commits all W tokens per forward in
  steady state (forwards carry W filled + W mask slots): the ceiling the engine reaches;
* ``wedlm:0.4`` (WeDLM's default threshold): random weights are never confident, so one token
  commits per forward (windows of 1 filled + W masks): the floor, the pure overhead of a window.

With ``request_ar``, one more WeDLM engine (the server's default W) whose requests all decode AR
(``wedlm_decoding: ar``, row mode ``wedlm-ar``): what a window that falls to W 0 would cost if each
such request stepped as one AR row on the WeDLM engine.

A step's time is taken from two runs of different output lengths, so prefill and start-up cancel:
``(T(n2) - T(n1)) / (steps(n2) - steps(n1))``, measured ``repeats`` times per point (the row keeps
the median and the spread). WeDLM rows also say which CUDA graph mode their steps replayed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.modes import FILL_ALL, token_budget, widest_window
from benchmarks.offline import engine_scheduling
from vllm_wedlm.checkpoints.tiny import (
    TinySpec,
    published_config,
    special_token_ids,
    train_tokenizer,
    write_model_files,
)
from vllm_wedlm.config import AUTO_WINDOW, REQUEST_DECODING, REQUEST_ENTROPY_THRESHOLD, max_window_tokens
from vllm_wedlm.engine_settings import engine_kwargs
from vllm_wedlm.evaluation import (
    counts_since,
    graph_modes,
    graph_modes_since,
    request_forwards,
    row_layouts,
    start_window_trace,
    window_histogram,
    window_steps,
    window_steps_since,
)

#: The engine (and row mode) of WeDLM's engine decoding every request AR.
REQUEST_AR = "wedlm-ar"

SHAPES = {
    # Qwen3-8B (the body of WeDLM-8B): 36 layers, hidden 4096, GQA 32/8 heads of 128, vocab 151,936.
    "qwen3-8b": (TinySpec(variant="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=40960), 151936),
    "tiny": (TinySpec(variant="qwen3"), 1024),
}


def write_shape(out: Path, shape: str) -> Path:
    """A weightless WeDLM checkpoint of ``shape`` (configs and a small tokenizer)."""
    spec, vocab_size = SHAPES[shape]
    tokenizer = train_tokenizer(spec.seed, 1000)
    write_model_files(out, tokenizer, spec, published_config(spec, vocab_size, special_token_ids(tokenizer)))
    return out


def _time_run(llm, prompts: list[list[int]], max_tokens: int, tau: float | None, request_ar: bool = False) -> float:
    from vllm import SamplingParams

    extra_args = {REQUEST_DECODING: "ar"} if request_ar else None if tau is None else {REQUEST_ENTROPY_THRESHOLD: tau}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start


def _steps(llm, decoding: str, batch: int, max_tokens: int, before: int) -> tuple[float, int]:
    """(steps per request, forwards counter now) of the run that just ended."""
    if decoding in ("ar", REQUEST_AR):  # one step per token
        return float(max_tokens), before
    now = request_forwards(llm)
    return (now - before) / batch, now


def _measure(llm, decoding: str, prompts: list[list[int]], lengths: tuple[int, int], tau: float | None) -> tuple:
    """(seconds per step, tokens per step) of one pair of runs."""
    n1, n2 = lengths
    batch = len(prompts)
    counter = request_forwards(llm) if decoding == "wedlm" else 0
    t1 = _time_run(llm, prompts, n1, tau, decoding == REQUEST_AR)
    s1, counter = _steps(llm, decoding, batch, n1, counter)
    t2 = _time_run(llm, prompts, n2, tau, decoding == REQUEST_AR)
    s2, counter = _steps(llm, decoding, batch, n2, counter)
    return (t2 - t1) / (s2 - s1), (n2 - n1) / (s2 - s1)


def _engine_graphs(llm) -> dict:
    compilation = llm.llm_engine.vllm_config.compilation_config
    return {"cudagraph_mode": str(compilation.cudagraph_mode.name if compilation.cudagraph_mode else None),
            "max_cudagraph_capture_size": compilation.max_cudagraph_capture_size}


def run(model: Path, *, windows: list[int | str], batch_sizes: list[int], taus: list[str], prompt_tokens: int,
        lengths: tuple[int, int], engine_overrides: dict[str, Any], progress, repeats: int = 1,
        schedulings: tuple[str, ...] = ("default",), request_ar: bool = False) -> list[dict]:
    """``schedulings``: how WeDLM engines schedule, each its own engine: "default" (the engine's
    own choice, recorded per row), "sync" (--no-async-scheduling: exact window rows, one step at a
    time) and/or "async" (--async-scheduling: fixed window rows). A window "auto" is the adaptive
    window (at most the default W); its rows count the windows planned at each W (``window_histogram``)."""
    from vllm import LLM

    _, n2 = lengths
    rng = np.random.default_rng(0)
    widest = max(widest_window(w) for w in windows)
    engines = [("ar", None, None)] + [("wedlm", w, how) for w in windows for how in schedulings]
    if request_ar:
        engines += [(REQUEST_AR, None, how) for how in schedulings]
    total = len(batch_sizes) * (1 + len(windows) * len(schedulings) * len(taus) + request_ar * len(schedulings))
    rows = []
    for decoding, window, scheduling in engines:
        # Room for the prompt, the output and the last windows, whole.
        max_model_len = prompt_tokens + n2 + max_window_tokens(widest) + 16
        settings = engine_kwargs(**{"max_model_len": max_model_len, **engine_overrides})
        settings.update(load_format="dummy", max_num_seqs=max(batch_sizes),
                        max_num_batched_tokens=token_budget(max(batch_sizes), widest),
                        additional_config={"decoding": "ar" if decoding == "ar" else "wedlm",
                                           **({"window_size": window} if window else {})})
        if scheduling not in (None, "default"):
            settings["async_scheduling"] = scheduling == "async"
        started = time.perf_counter()
        llm = LLM(str(model), **settings)
        engine = {"engine_start_s": round(time.perf_counter() - started, 1), **_engine_graphs(llm)}
        if decoding != "ar":  # what ran, whatever was asked
            engine.update(engine_scheduling(llm))
        fixed = engine.get("window_rows") == "fixed"
        try:
            vocab = llm.llm_engine.model_config.get_vocab_size()
            for tau_name in (taus if decoding == "wedlm" else ["ar"]):
                tau = None if decoding != "wedlm" else (FILL_ALL if tau_name == "inf" else float(tau_name))
                for batch in batch_sizes:
                    prompts = rng.integers(0, min(vocab, 1000), (batch, prompt_tokens)).tolist()
                    _time_run(llm, prompts, 8, tau, decoding == REQUEST_AR)  # warm-up at this batch size
                    modes_before = graph_modes(llm) if decoding != "ar" else {}
                    steps_before = window_steps(llm) if decoding != "ar" else {}
                    layouts_before = row_layouts(llm) if fixed else {}
                    adaptive = window == AUTO_WINDOW
                    if adaptive:  # the W of every window planned, over the timed runs
                        start_window_trace(llm)
                    runs = [_measure(llm, decoding, prompts, lengths, tau) for _ in range(repeats)]
                    steps_ms = sorted(step_s * 1e3 for step_s, _ in runs)
                    step_ms = float(np.median(steps_ms))
                    tokens_per_step = float(np.median([tokens for _, tokens in runs]))
                    mode = f"wedlm:{tau_name}" if decoding == "wedlm" else decoding
                    row = {"mode": mode, "window_size": window,
                           "batch_size": batch, "prompt_tokens": prompt_tokens, "step_ms": round(step_ms, 3),
                           "step_ms_spread": [round(steps_ms[0], 3), round(steps_ms[-1], 3)], "repeats": repeats,
                           "tokens_per_step": round(tokens_per_step, 3),
                           "output_tok_s": round(batch * tokens_per_step / step_ms * 1e3, 1), **engine}
                    if adaptive:
                        row["window_histogram"] = window_histogram(llm)
                    if fixed:  # the gate's choices: steps padded (pipelined) or exact
                        row["row_layouts"] = counts_since(row_layouts(llm), layouts_before)
                    if decoding != "ar":  # graphs replayed; the window steps' device work compiled or eager
                        row["graph_modes"] = graph_modes_since(llm, modes_before)
                        row["window_steps"] = window_steps_since(llm, steps_before)
                    rows.append(row)
                    progress(len(rows), total, row)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    ar = {r["batch_size"]: r for r in rows if r["mode"] == "ar"}
    for row in rows:
        if row["batch_size"] in ar:
            row["step_vs_ar"] = round(row["step_ms"] / ar[row["batch_size"]]["step_ms"], 3)
            row["speedup_vs_ar"] = round(row["output_tok_s"] / ar[row["batch_size"]]["output_tok_s"], 3)
    return rows
