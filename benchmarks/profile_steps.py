"""Where a decoding step's time goes, engine and worker in this process.

    python -m benchmarks.profile_steps --model DIR --decoding wedlm --batch-size 64 --kind arithmetic
    python -m benchmarks.profile_steps --model DIR --decoding wedlm --batch-size 1 --kernel-time
    python -m benchmarks.profile_steps --shape qwen3-8b --decoding wedlm --batch-size 16 --tau 0.4 \
        --async-scheduling --async-padding-tokens 0 --kernel-time

vLLM runs its engine core and (with one GPU) its worker in this process when
``VLLM_ENABLE_V1_MULTIPROCESSING=0``. By default Python's profiler sees the scheduler, the model
runner (our overrides included) and the points where the CPU waits for the GPU. With
``--kernel-time`` (GPU) the batch first runs once unprofiled for its wall time per step, then once
under torch's profiler for the GPU's kernel time per step: what of a step the GPU is busy, hence
what overlapping the host's work with it could save at most. ``--json`` also gets that time by kind
of kernel (attention, matrix products, other) and the ``--top`` kernels, each per step.

``--shape`` profiles a model of a real shape on random weights instead of a trained one (as
``benchmarks step-cost`` measures it): random prompt token ids of ``--prompt-tokens``, every answer
``--max-tokens`` long, and ``--tau`` (e.g. 0.4: one token per forward on random weights, the step
cost's floor). ``--async-scheduling`` runs vLLM's async scheduling (WeDLM with fixed window rows);
``--async-padding-tokens`` sets its gate (0: every step forwards exact rows).

The host work of the async engine's code on a CPU (lab notebook 5.31): a tiny shape with fixed rows,
every window padded, the adaptive window choosing on the 8B shape's cost curve:

    python -m benchmarks.profile_steps --shape tiny --decoding wedlm --window-size auto --batch-size 64 \
        --tau 0.4 --fixed-rows --async-padding-tokens 1048576 --cost-shape qwen3-8b --max-model-len 512
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    from benchmarks.modes import parse_window_size

    parser = argparse.ArgumentParser(description=__doc__)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a trained model's directory")
    model.add_argument("--shape", help="a model shape of benchmarks step-cost (random weights), e.g. qwen3-8b")
    parser.add_argument("--decoding", choices=("ar", "wedlm"), default="wedlm")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--kind", default="arithmetic")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--window-size", type=parse_window_size,
                        help="WeDLM's W, or auto (adaptive; default: the server's)")
    parser.add_argument("--request-decoding", choices=("wedlm", "ar"), default="wedlm",
                        help="with --decoding wedlm: decode the requests AR on the WeDLM engine (wedlm_decoding ar)")
    parser.add_argument("--tau", type=float, help="each request's entropy threshold (default: the model's)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="with --shape: each prompt's length")
    parser.add_argument("--async-scheduling", action="store_true", help="vLLM's async scheduling (GPU)")
    parser.add_argument("--async-padding-tokens", type=int, help="with --async-scheduling: the gate's budget")
    parser.add_argument("--fixed-rows", action="store_true",
                        help="fixed window rows (the async engine's layout; on a CPU it runs synchronously)")
    parser.add_argument("--cost-shape", help="with --window-size auto: the adaptive window chooses W on this "
                        "shape's step-cost curve (e.g. qwen3-8b, profiled on a small model's host work)")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--ignore-eos", action="store_true", help="every answer runs to --max-tokens")
    parser.add_argument("--kernel-time", action="store_true", help="wall vs GPU kernel time per step (GPU)")
    parser.add_argument("--json", help="with --kernel-time: write the numbers here")
    parser.add_argument("--stats", help="also write the profiled run's raw statistics here (pstats: callers, callees)")
    parser.add_argument("--timeline", help="write here where each engine step's host time went, slice by slice of "
                        "one more unprofiled run (benchmarks.step_timeline)")
    parser.add_argument("--timeline-parts", type=int, default=8, help="with --timeline: slices of the run")
    parser.add_argument("--sync-debug", action="store_true",
                        help="with --timeline (GPU): count the host's waits for the GPU by call site")
    parser.add_argument("--trace", help="with --kernel-time: write the profiled run's timeline here "
                        "(Chrome trace, Python calls included; .gz to compress)")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    from vllm_wedlm.config import ASYNC_PADDING_KEY, FIXED_ROWS_KEY, REQUEST_DECODING, REQUEST_ENTROPY_THRESHOLD
    from vllm_wedlm.engine_settings import engine_kwargs

    additional_config = {"decoding": args.decoding}
    if args.window_size is not None:
        additional_config["window_size"] = args.window_size
    if args.async_padding_tokens is not None:
        additional_config[ASYNC_PADDING_KEY] = args.async_padding_tokens
    if args.fixed_rows:
        additional_config[FIXED_ROWS_KEY] = True
    if args.cost_shape:
        _choose_on_cost_curve(args.cost_shape)
    settings = engine_kwargs(max_model_len=args.max_model_len)
    if args.gpu_memory_utilization:
        settings["gpu_memory_utilization"] = args.gpu_memory_utilization
    settings.update(additional_config=additional_config, max_num_seqs=args.batch_size)
    if args.async_scheduling:
        settings["async_scheduling"] = True
    if args.shape:
        import numpy as np

        from benchmarks.modes import token_budget, widest_window
        from benchmarks.step_cost import write_shape

        model = str(write_shape(Path(tempfile.mkdtemp()), args.shape))
        settings.update(load_format="dummy", max_num_batched_tokens=token_budget(args.batch_size,
                                                                                 widest_window(args.window_size)))
        llm = LLM(model, **settings)
        vocab = llm.llm_engine.model_config.get_vocab_size()
        prompts = np.random.default_rng(0).integers(0, min(vocab, 1000), (args.batch_size, args.prompt_tokens))
        texts = [{"prompt_token_ids": p} for p in prompts.tolist()]
    else:
        from transformers import AutoTokenizer

        from benchmarks.workload import build, take
        from vllm_wedlm.evaluation import trained_max_number

        prompts = build(AutoTokenizer.from_pretrained(args.model), [args.kind], args.batch_size, 0,
                        trained_max_number(args.model))[args.kind]
        texts = [p.text for p in take(prompts, args.batch_size)]
        llm = LLM(args.model, **settings)
    extra_args = {} if args.tau is None else {REQUEST_ENTROPY_THRESHOLD: args.tau}
    if args.request_decoding == "ar":
        extra_args[REQUEST_DECODING] = "ar"
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos or bool(args.shape),
                            extra_args=extra_args or None)
    llm.generate(texts, params, use_tqdm=False)  # warm-up
    if args.timeline:
        _timeline(llm, texts, params, args)
    if args.kernel_time:
        _kernel_time(llm, texts, params, args)
    before = _steps(llm, args)
    profiler = cProfile.Profile()
    profiler.enable()
    outputs = llm.generate(texts, params, use_tqdm=False)
    profiler.disable()
    if args.stats:
        profiler.dump_stats(args.stats)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    num_steps = _steps(llm, args, outputs) - before
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    print(f"{args.decoding}: {tokens} tokens in {num_steps} steps, {stats.total_tt:.3f} s profiled "
          f"({stats.total_tt * 1e3 / num_steps:.2f} ms per step)")
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


def _choose_on_cost_curve(shape: str) -> None:
    """Give the scheduler (in this process) the step-cost curve of ``shape`` for its adaptive window,
    so that a small model's run chooses W as the large model would, and its host work is the large
    model's choice's (the policy's arithmetic, the reaches, the spans), without its forward."""
    import dataclasses

    from benchmarks.step_cost import SHAPES
    from vllm_wedlm.adapter import async_gate, scheduler

    cost = async_gate.step_cost(SimpleNamespace(**dataclasses.asdict(SHAPES[shape][0])))
    scheduler.step_cost = lambda hf_config, knee=None: cost


def _steps(llm, args, outputs=None) -> int:
    """Engine steps so far: WeDLM's runner counts them (per graph mode); for AR, 0 before a run and
    one per token of its longest answer after it (its prefill step draws the first)."""
    from vllm_wedlm.evaluation import graph_modes

    if args.decoding == "wedlm":
        return sum(graph_modes(llm).values())
    return max(len(o.outputs[0].token_ids) for o in outputs) if outputs else 0


def _timeline(llm, texts, params, args) -> None:
    from benchmarks.step_timeline import timeline

    def run():
        llm.generate(texts, params, use_tqdm=False)

    result = timeline(llm, run, args.timeline_parts)
    if args.sync_debug:  # a second run: the checks and their stacks cost host time of their own
        checked = timeline(llm, run, args.timeline_parts, sync_debug=True)
        result.update(sync_sites=checked.get("sync_sites", {}), sync_debug_slices=checked["slices"])
    result.update(decoding=args.decoding, window_size=args.window_size, batch=args.batch_size,
                  max_tokens=args.max_tokens)
    print(json.dumps(result))
    with open(args.timeline, "w") as f:
        json.dump(result, f, indent=1)


def _kernel_time(llm, texts, params, args) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from vllm_wedlm.evaluation import window_steps

    before = _steps(llm, args)
    start = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    num_steps = _steps(llm, args, outputs) - before
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=bool(args.trace)) as prof:
        llm.generate(texts, params, use_tqdm=False)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    # Kernels only: a host-side op (an eager aten op, a graph launch) also reports its kernels' time.
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    kernel_us = sum(e.self_device_time_total for e in kernels)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {"decoding": args.decoding, "batch": args.batch_size, "tokens": tokens, "steps": num_steps,
              "wall_ms_per_step": wall * 1e3 / num_steps, "gpu_kernel_ms_per_step": kernel_us / 1e3 / num_steps,
              "gpu_ms_per_step_by_kind": kernel_kinds(kernels, num_steps),
              "top_kernels": [{"name": e.key[:160], "ms_per_step": round(e.self_device_time_total / 1e3 / num_steps, 4),
                               "calls_per_step": round(e.count / num_steps, 2)}
                              for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.top]]}
    if args.decoding == "wedlm":  # both runs: were the window steps' device work compiled?
        result["window_steps"] = window_steps(llm)
    print(json.dumps(result))
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


# Kernel name fragments by what the kernel does, first match wins: attention (FlashAttention 3's
# kernels, which are CUTLASS kernels, hence first, and vLLM's KV cache write for it), matrix products
# (cuBLAS's and CUTLASS's names), then everything else (norms, activations, rotary embedding, the
# window step's fused reductions, copies).
KERNEL_KINDS = (("attention", ("flash", "fmha")), ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "splitk")))


def kernel_kinds(kernels, num_steps: int) -> dict[str, float]:
    """GPU milliseconds per step by kind of kernel (``KERNEL_KINDS``), from torch profiler averages."""
    totals = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for event in kernels:
        name = event.key.lower()
        kind = next((kind for kind, parts in KERNEL_KINDS if any(part in name for part in parts)), "other")
        totals[kind] += event.self_device_time_total / 1e3 / num_steps
    return {kind: round(ms, 3) for kind, ms in totals.items()}


if __name__ == "__main__":
    main()
