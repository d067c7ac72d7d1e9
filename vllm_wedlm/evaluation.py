"""Held-out task accuracy and tokens per forward of a WeDLM checkpoint, AR vs WeDLM, in vLLM.

    python -m vllm_wedlm.evaluation MODEL_DIR --per-kind 50 --json results.json

Each decoding mode gets its own engine (same settings otherwise); each task kind is generated as
one batch, greedy. Tokens per forward (TPF) = output tokens / windows forwarded for those
requests, read from the WeDLM workers; AR makes one token per forward by construction.
Accuracy: arithmetic compares the final ``The answer is N.``; counting must match exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vllm_wedlm.training.data.tasks import KINDS, MAX_NUMBER, Task, chat_prompt, final_answer, generate

SCORED_KINDS = ("counting", "arithmetic")


def is_correct(task: Task, text: str) -> bool | None:
    """Whether an answer is right, for kinds with a verifiable answer; None otherwise."""
    if task.kind == "arithmetic":
        return final_answer(text) == task.answer
    if task.kind == "counting":
        return text.strip() == task.response
    return None


def evaluate_mode(
    model: str,
    decoding: str,
    tasks: dict[str, list[Task]],
    *,
    max_tokens: int = 256,
    window_size: int | None = None,
    entropy_threshold: float | None = None,
    engine_overrides: dict[str, Any] | None = None,
) -> dict[str, dict]:
    """Per task kind: requests, output tokens, seconds, TPF (WeDLM) and accuracy (scored kinds)."""
    from vllm import LLM, SamplingParams

    from vllm_wedlm.engine_settings import engine_kwargs

    settings: dict[str, Any] = {"decoding": decoding}
    if window_size is not None:
        settings["window_size"] = window_size
    if entropy_threshold is not None:
        settings["entropy_threshold"] = entropy_threshold
    llm = LLM(model, additional_config=settings, **engine_kwargs(**(engine_overrides or {})))
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    results = {}
    try:
        for kind, kind_tasks in tasks.items():
            prompts = [chat_prompt(tokenizer, t) for t in kind_tasks]
            before = request_forwards(llm) if decoding == "wedlm" else 0
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            forwards = (request_forwards(llm) if decoding == "wedlm" else 0) - before
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            verdicts = [is_correct(t, o.outputs[0].text) for t, o in zip(kind_tasks, outputs, strict=True)]
            entry = {"requests": len(outputs), "output_tokens": tokens, "seconds": round(seconds, 3)}
            entry["tokens_per_forward"] = tokens / forwards if decoding == "wedlm" else 1.0
            if kind in SCORED_KINDS:
                entry["accuracy"] = sum(bool(v) for v in verdicts) / len(verdicts)
            entry["samples"] = [o.outputs[0].text for o in outputs[:2]]
            results[kind] = entry
    finally:
        llm.llm_engine.engine_core.shutdown()
    return results


def request_forwards(llm) -> int:
    """Windows a WeDLM ``vllm.LLM`` has forwarded so far, summed over its workers."""
    return sum(llm.collective_rpc("wedlm_request_forwards"))


def vllm_steps(llm) -> int:
    """Steps a WeDLM ``vllm.LLM`` has handed to vLLM whole (AR requests alone), summed over its workers."""
    return sum(llm.collective_rpc("wedlm_vllm_steps"))


def start_window_trace(llm) -> None:
    """Record the W of every window a WeDLM ``vllm.LLM`` plans from now on (``window_histogram``)."""
    llm.collective_rpc("wedlm_trace_window_sizes", args=(True,))


def window_histogram(llm) -> dict[str, int]:
    """Stop the record ``start_window_trace`` began; windows planned at each W since ({"W": count},
    in order of W), over every worker."""
    sizes = Counter(w for trace in llm.collective_rpc("wedlm_trace_window_sizes", args=(False,))
                    for planned in trace.values() for w in planned)
    return {str(w): n for w, n in sorted(sizes.items())}


def _summed_counts(llm, method: str) -> dict[str, int]:
    """The counts each worker's ``method`` returns ({name: count}), summed over the workers."""
    total: dict[str, int] = {}
    for counts in llm.collective_rpc(method):
        for name, count in counts.items():
            total[name] = total.get(name, 0) + count
    return total


def graph_modes(llm) -> dict[str, int]:
    """Steps a WeDLM ``vllm.LLM`` has run so far per CUDA graph mode (FULL, PIECEWISE, NONE = eager)."""
    return _summed_counts(llm, "wedlm_graph_modes")


def graph_modes_since(llm, before: dict[str, int]) -> dict[str, int]:
    return counts_since(graph_modes(llm), before)


def counts_since(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: count - before.get(key, 0) for key, count in now.items() if count > before.get(key, 0)}


def row_layouts(llm) -> dict[str, int]:
    """Steps of fixed window rows (async scheduling) a WeDLM ``vllm.LLM`` has run so far with every
    window padded to its longest possible run ("padded", pipelined: 2W rows at a fixed W, S + W for an
    adaptive window) and with exact rows ("exact"); also the windows void for a step ("void_windows")
    and the steps that only waited for the one in flight ("waits")."""
    return _summed_counts(llm, "wedlm_row_layouts")


def window_steps(llm) -> dict[str, int]:
    """Steps of plain windows a WeDLM ``vllm.LLM`` has run so far with their device work compiled
    and eagerly (``adapter/window_step.py``), summed over its workers."""
    return _summed_counts(llm, "wedlm_window_steps")


def window_steps_since(llm, before: dict[str, int]) -> dict[str, int]:
    return counts_since(window_steps(llm), before)


def trained_max_number(model: str) -> int:
    """The number range a model was trained on (its training.json), else the generator's default:
    held-out tasks must come from the distribution the model learned."""
    record = Path(model) / "training.json"
    if record.exists():
        return json.loads(record.read_text())["recipe"].get("max_number", MAX_NUMBER)
    return MAX_NUMBER


def held_out_tasks(per_kind: int, kinds: tuple[str, ...] = KINDS, seed: int = 0,
                   max_number: int = MAX_NUMBER) -> dict[str, list[Task]]:
    return {kind: generate(kind, "test", per_kind, seed, max_number) for kind in kinds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Held-out accuracy and tokens per forward, AR vs WeDLM, in vLLM.")
    parser.add_argument("model")
    parser.add_argument("--per-kind", type=int, default=50, help="held-out tasks per kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--modes", default="ar,wedlm")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--window-size", type=int)
    parser.add_argument("--entropy-threshold", type=float)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (faster start-up on a GPU)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        help="GPU memory share of each engine (several evaluations can share one GPU)")
    parser.add_argument("--kv-cache-memory-bytes", type=int,
                        help="fixed KV cache size (skips memory profiling, which other engines on the GPU disturb)")
    parser.add_argument("--dtype", help="the engine's dtype (default: the checkpoint's)")
    parser.add_argument("--quantization", help="vLLM's --quantization, e.g. fp8 (GPU)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    overrides = {}
    if args.enforce_eager:
        overrides["enforce_eager"] = True
    if args.gpu_memory_utilization:
        overrides["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.kv_cache_memory_bytes:
        overrides["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    if args.dtype:
        overrides["dtype"] = args.dtype
    if args.quantization:
        overrides["quantization"] = args.quantization
    tasks = held_out_tasks(args.per_kind, tuple(args.kinds.split(",")), max_number=trained_max_number(args.model))
    # the window that ran: a fixed W, or the engine's default (the adaptive window)
    report = {"model": args.model, "per_kind": args.per_kind, "window_size": args.window_size or "auto", "modes": {}}
    for mode in args.modes.split(","):
        report["modes"][mode] = evaluate_mode(
            args.model, mode, tasks, max_tokens=args.max_tokens,
            window_size=args.window_size, entropy_threshold=args.entropy_threshold,
            engine_overrides=overrides,
        )
    for kind in tasks:
        cells = []
        for mode, results in report["modes"].items():
            entry = results[kind]
            accuracy = f", accuracy {entry['accuracy']:.2f}" if "accuracy" in entry else ""
            cells.append(f"{mode}: TPF {entry['tokens_per_forward']:.2f}{accuracy}")
        print(f"{kind:>10}  " + "  |  ".join(cells), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
