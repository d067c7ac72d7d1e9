"""Command line of the benchmark harness: ``python -m benchmarks {offline,online,step-cost,report}``."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from benchmarks import offline, online, report, step_cost, workload
from benchmarks.modes import parse_modes, parse_window_size
from benchmarks.stats import add_ratios_to_ar
from vllm_wedlm.evaluation import trained_max_number

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "tiny-wedlm-qwen3-sharp"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def default_model() -> str:
    """A tiny random checkpoint with a sharpened head: shows the harness works, not real speed."""
    from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint

    if not (DEFAULT_MODEL_DIR / "model.safetensors").exists():
        make_tiny_checkpoint(DEFAULT_MODEL_DIR, TinySpec(variant="qwen3", logit_scale=30.0))
    return str(DEFAULT_MODEL_DIR)


PARTIAL: Path | None = None  # rows so far, one JSON line each (kept if a run is cut short)


def progress(done: int, total: int, row: dict) -> None:
    if PARTIAL is not None:
        with PARTIAL.open("a") as f:
            f.write(json.dumps(row) + "\n")
    keys = ("kind", "batch_size", "concurrency", "window_size", "shots", "max_tokens")
    where = " ".join(f"{k} {row[k]}" for k in keys if row.get(k) is not None)
    cells = [f"{row['output_tok_s']:,.0f} tok/s"]
    for key, label in (("tokens_per_forward", "TPF"), ("tokens_per_step", "tokens/step"), ("step_ms", "ms/step"),
                       ("accuracy", "accuracy"), ("ttft_s_p50", "TTFT p50 s")):
        if row.get(key) is not None:
            cells.append(f"{label} {row[key]:.3g}")
    print(f"[{done}/{total}] {row['mode']:<10} {where}: {', '.join(cells)}", file=sys.stderr, flush=True)


def environment() -> dict:
    import torch
    import transformers
    import vllm
    from vllm.platforms import current_platform

    device = current_platform.get_device_name() if current_platform.is_cuda() else platform.processor() or "cpu"
    return {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "python": platform.python_version()}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="WeDLM checkpoint (default: a tiny local random one)")
    parser.add_argument("--modes", default="ar,ngram,wedlm:0.2,wedlm:0.4,wedlm:0.8",
                        help="comma-separated: ar, ngram[:K], wedlm[:TAU], wedlm:inf, lossless[:TAU], wedlm-ar; "
                             "+wN after a WeDLM one for a fixed W N (none: the engine's default, the adaptive "
                             "window), then +async or +sync for that scheduling (none: the engine's default)")
    parser.add_argument("--kinds", default="counting,arithmetic,code,prose",
                        help="task kinds, of counting, arithmetic, code, prose, humaneval (pass@1 in a sandbox)")
    parser.add_argument("--requests", type=int, default=32, help="prompts per task kind")
    parser.add_argument("--shots", default="0", help="solved examples before each prompt (prompt-length sweep)")
    parser.add_argument("--max-tokens", default="256", help="output token limits (output-length sweep)")
    parser.add_argument("--ignore-eos", action="store_true", help="always produce max_tokens tokens")
    parser.add_argument("--window-size", type=int,
                        help="a fixed W for every WeDLM engine but +auto ones (default: the engine's, the adaptive "
                             "window at most 16)")
    parser.add_argument("--window-tokens", type=int,
                        help="adaptive window's knee: window rows a step takes at no extra cost, W at most "
                             "--window-size (default: the model's)")
    parser.add_argument("--max-model-len", type=int, help="default: the model's own")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--json", required=True, help="write the results here")


def _workloads(args, model: str) -> dict[int, dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    kinds = [k for k in args.kinds.split(",") if k]
    top = trained_max_number(model)
    return {shots: workload.build(tokenizer, kinds, args.requests, shots, top) for shots in _ints(args.shots)}


def _engine_overrides(args) -> dict:
    overrides = {"max_model_len": args.max_model_len}  # None: the model's own
    if args.gpu_memory_utilization:
        overrides["gpu_memory_utilization"] = args.gpu_memory_utilization
    return overrides


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_off = sub.add_parser("offline", help="vllm.LLM, whole batches at once")
    _common(p_off)
    p_off.add_argument("--batch-sizes", default="1,8,64")
    p_off.add_argument("--repeats", type=int, default=1, help="timed runs per point (median and spread kept)")
    p_off.add_argument("--structured", default="none",
                       help="structured outputs of every request, one point each: comma-separated of "
                            "none, json (an answer object), arithmetic-format (the arithmetic tasks' own format, "
                            "a regex); vLLM's xgrammar with no free JSON whitespace")
    p_off.add_argument("--interleave", action="store_true",
                       help="keep every mode's engine up and alternate the modes repeat by repeat, so that a "
                       "machine's drift moves them alike (needs the memory of all engines at once)")
    p_on = sub.add_parser("online", help="a real vllm serve under fixed concurrency, streamed")
    _common(p_on)
    p_on.add_argument("--concurrency", default="1,8,64")
    p_on.add_argument("--log-dir", help="keep the servers' logs here")
    p_on.add_argument("--interleave", action="store_true",
                      help="keep every mode's server up and run the modes back to back at each point, so that "
                      "a machine's drift moves them alike (needs the memory of all servers at once)")
    p_step = sub.add_parser("step-cost", help="time per decoding step on a real-shaped random model")
    p_step.add_argument("--shape", choices=sorted(step_cost.SHAPES), default="qwen3-8b")
    p_step.add_argument("--windows", default="8,16,32",
                        help="W of each WeDLM engine, or 'auto' (the adaptive window, at most 16)")
    p_step.add_argument("--batch-sizes", default="1,4,16,64")
    p_step.add_argument("--taus", default="inf,0.4", help="WeDLM thresholds (inf: every mask fills)")
    p_step.add_argument("--prompt-tokens", type=int, default=128)
    p_step.add_argument("--lengths", default="128,384", help="the two output lengths whose difference is timed")
    p_step.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p_step.add_argument("--workdir", default=str(Path(".cache") / "step-cost"))
    p_step.add_argument("--repeats", type=int, default=1, help="timed pairs per point (median and spread kept)")
    p_step.add_argument("--cudagraph-mode", help="vLLM's compilation_config cudagraph_mode for every engine "
                        "(default: vLLM's)")
    p_step.add_argument("--scheduling", default="default",
                        help="WeDLM engines' scheduling, comma-separated, one engine each: default (the engine's "
                        "own: async on a GPU), sync (--no-async-scheduling, exact window rows) and/or async "
                        "(--async-scheduling, fixed window rows); each row records what ran")
    p_step.add_argument("--request-ar", action="store_true", help="also a WeDLM engine whose requests all decode AR "
                        "(wedlm_decoding ar, rows 'wedlm-ar'), per --scheduling")
    p_step.add_argument("--json", required=True)
    p_rep = sub.add_parser("report", help="markdown tables (and plots, with --out) from result files",
                           description=report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_arguments(p_rep)
    args = parser.parse_args(argv)

    if args.command == "report":
        report.main(args)
        return
    global PARTIAL
    PARTIAL = Path(args.json + ".partial")
    PARTIAL.parent.mkdir(parents=True, exist_ok=True)
    PARTIAL.unlink(missing_ok=True)
    started = time.time()
    record = {"benchmark": args.command, "command": " ".join(["python -m benchmarks", *(argv or sys.argv[1:])])}
    if args.command == "step-cost" and not set(args.scheduling.split(",")) <= {"default", "sync", "async"}:
        parser.error(f"--scheduling takes default, sync and/or async, got {args.scheduling!r}")
    if args.command == "step-cost":
        model = step_cost.write_shape(Path(args.workdir) / args.shape, args.shape)
        overrides = {"gpu_memory_utilization": args.gpu_memory_utilization}
        if args.cudagraph_mode:
            overrides["compilation_config"] = {"cudagraph_mode": args.cudagraph_mode}
        windows = [parse_window_size(w) for w in args.windows.split(",")]
        rows = step_cost.run(model, windows=windows, batch_sizes=_ints(args.batch_sizes),
                             taus=[t for t in args.taus.split(",") if t], prompt_tokens=args.prompt_tokens,
                             lengths=tuple(_ints(args.lengths)), engine_overrides=overrides, progress=progress,
                             repeats=args.repeats, schedulings=tuple(args.scheduling.split(",")),
                             request_ar=args.request_ar)
        record.update(model=f"{args.shape} (random weights)")
    else:
        model = args.model or default_model()
        modes = parse_modes(args.modes)
        workloads = _workloads(args, model)
        common = dict(max_tokens=_ints(args.max_tokens), ignore_eos=args.ignore_eos, window_size=args.window_size,
                      window_tokens=args.window_tokens, progress=progress)
        if args.command == "offline":
            structured = tuple(args.structured.split(","))
            unknown = set(structured) - set(workload.STRUCTURED)
            if unknown:
                parser.error(f"--structured: unknown {sorted(unknown)}; known: {', '.join(workload.STRUCTURED)}")
            overrides = _engine_overrides(args)
            if structured != ("none",):
                overrides["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
            rows = offline.run(model, modes, workloads, batch_sizes=_ints(args.batch_sizes),
                               engine_overrides=overrides, repeats=args.repeats,
                               interleave=args.interleave, structured=structured, **common)
        else:
            extra = ["--max-model-len", str(args.max_model_len)] if args.max_model_len else []
            if args.gpu_memory_utilization:
                extra += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
            rows = online.run(model, modes, workloads, concurrencies=_ints(args.concurrency), requests=args.requests,
                              serve_extra=extra + _machine_serve_args(), log_dir=args.log_dir,
                              interleave=args.interleave, **common)
        rows = add_ratios_to_ar(rows)
        record.update(model=model)
    record.update(environment=environment(), seconds=round(time.time() - started, 1), rows=rows)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    PARTIAL.unlink(missing_ok=True)
    print(report.table(record))


def _machine_serve_args() -> list[str]:
    """On the CPU, the same eager mode and KV budget as ``vllm.LLM`` gets from ``engine_kwargs``; on a
    GPU, vLLM's memory defaults, unless parallel processes share it (``shared_gpu_memory``)."""
    from vllm_wedlm.engine_settings import CPU_KV_CACHE_BYTES, on_gpu, serve_flags, shared_gpu_memory

    if on_gpu():
        return serve_flags(shared_gpu_memory())
    return ["--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
