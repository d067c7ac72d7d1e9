"""Where a decoding step's time goes, engine and worker in this process.

    python -m benchmarks.profile_steps --model DIR --decoding wedlm --batch-size 64 --kind arithmetic
    python -m benchmarks.profile_steps --model DIR --decoding wedlm --batch-size 1 --kernel-time

vLLM runs its engine core and (with one GPU) its worker in this process when
``VLLM_ENABLE_V1_MULTIPROCESSING=0``. By default Python's profiler sees the scheduler, the model
runner (our overrides included) and the points where the CPU waits for the GPU. With
``--kernel-time`` (GPU) the batch runs once unprofiled for its wall time per step, then once under
torch's profiler for the GPU's kernel time per step: what of a step the GPU is busy, hence what
overlapping the host's work with it could save at most.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--decoding", choices=("ar", "wedlm"), default="wedlm")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--kind", default="arithmetic")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--ignore-eos", action="store_true", help="every answer runs to --max-tokens")
    parser.add_argument("--kernel-time", action="store_true", help="wall vs GPU kernel time per step (GPU)")
    parser.add_argument("--json", help="with --kernel-time: write the numbers here")
    parser.add_argument("--trace", help="with --kernel-time: write the profiled run's timeline here "
                        "(Chrome trace, Python calls included; .gz to compress)")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from benchmarks.workload import build, take
    from vllm_wedlm.evaluation import trained_max_number
    from vllm_wedlm.testing import engine_kwargs

    prompts = build(AutoTokenizer.from_pretrained(args.model), [args.kind], args.batch_size, 0,
                    trained_max_number(args.model))[args.kind]
    texts = [p.text for p in take(prompts, args.batch_size)]
    llm = LLM(args.model, additional_config={"decoding": args.decoding}, max_num_seqs=args.batch_size,
              **engine_kwargs(max_model_len=args.max_model_len))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
    llm.generate(texts, params, use_tqdm=False)  # warm-up
    if args.kernel_time:
        _kernel_time(llm, texts, params, args)
        return
    profiler = cProfile.Profile()
    profiler.enable()
    outputs = llm.generate(texts, params, use_tqdm=False)
    profiler.disable()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    print(f"{args.decoding}: {tokens} tokens, {stats.total_tt:.3f} s profiled")
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


def _kernel_time(llm, texts, params, args) -> None:
    from torch.profiler import ProfilerActivity, profile

    from vllm_wedlm.evaluation import graph_modes, window_steps

    def steps() -> int | None:  # engine steps so far (WeDLM's runner counts them per graph mode)
        return sum(graph_modes(llm).values()) if args.decoding == "wedlm" else None

    before = steps()
    start = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    after = steps()
    # AR: one step per token of the longest answer (its prefill step draws the first).
    num_steps = after - before if after is not None else max(len(o.outputs[0].token_ids) for o in outputs)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=bool(args.trace)) as prof:
        llm.generate(texts, params, use_tqdm=False)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {"decoding": args.decoding, "batch": args.batch_size, "tokens": tokens, "steps": num_steps,
              "wall_ms_per_step": wall * 1e3 / num_steps, "gpu_kernel_ms_per_step": kernel_us / 1e3 / num_steps}
    if args.decoding == "wedlm":  # both runs: were the window steps' device work compiled?
        result["window_steps"] = window_steps(llm)
    print(json.dumps(result))
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
