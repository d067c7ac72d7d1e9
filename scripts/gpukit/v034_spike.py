"""Issue 70, item 3 on one H200: the V2 binding (vllm_wedlm/v2) in vLLM 0.34's real engine, under the
0.34 kit (README.md beside this: stage, install, ``source /tmp/kit34/env.sh``, then this).

    python3 scripts/gpukit/v034_spike.py exact --json $OUT/v034-exact.json
    python3 scripts/gpukit/v034_spike.py shape --modes ar,ar-sync --json /tmp/v034-ar.json
    python3 scripts/gpukit/v034_spike.py shape --modes wedlm --ar-json /tmp/v034-ar.json --json $OUT/v034-wedlm.json

``exact``: the shipped micro model in float32 (FlexAttention, as ``engine_settings`` picks for exact
float32 on CUDA), WeDLM W 16, greedy: ``diffusion_config`` canvas_length 2 W, ``--scheduler-cls``
WeDLMScheduler, the V2 model class registered (as tests/v034/test_engine.py starts it on the CPU, without
the CPU stand-ins). Held-out arithmetic chats, several at a time, their canvases 32 and 8 rows in turn
(W 16 and W 4 in one batch), each token for token against the reference decoder at its W.

``shape``: Qwen3-8B's shape with random weights (``benchmarks.step_cost.write_shape``), bf16, vLLM's
defaults otherwise (CUDA graphs; ``--max-capture-size`` widens the captured sizes). Each mode is its own
engine in its own process: ``ar`` (vLLM's Qwen3 class and default scheduling, async), ``ar-sync`` (the
same, synchronous), ``wedlm`` (the binding, W 16, synchronous as this slice is; tau inf = every mask
fills, and tau 0.4, on one engine). Per batch size: ms a step (two output lengths differenced, as
``benchmarks step-cost`` times it), tokens a request-step, output tok/s, TTFT (vLLM's per-request
first-token latency; median and max), and the CUDA graph mode (FULL / PIECEWISE / NONE) of every step
the timed runs took. WeDLM rows carry their ratio to the AR rows of the same machine.

Canvases narrower than the served one (vLLM's per-request ``diffusion_canvas_length``), at tau inf on the
wedlm engine, at each batch size above 1: ``one-row`` is one request whose canvas is a single row (the
rows of a W 0 step; the binding does not draw its AR token yet, so it fills one slot a forward and
commits it the next: its max_tokens is a 32nd of the others', so that every request runs the same
steps) beside W 16 ones; ``w8`` is every canvas 16 rows (W 8). Their rows say which graph mode a
batch of mixed or narrower canvases runs, and what its step costs.

Everything runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the step counters wrap vLLM's
dispatch of CUDA graphs, and tau is set on the engine's model state. ``--cpu`` runs the same on the CPU
machine with tests/v034/cpu_engine.py's stand-ins (eager, float32), a check of this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
W = 16
SHAPE_MODES = ("ar", "ar-sync", "wedlm")
TAUS = {"inf": 1e9, "0.4": 0.4}  # benchmarks.modes.FILL_ALL: above any entropy, every mask fills

#: CUDA graph mode of every step the engine ran (vLLM's dispatch), and windows per forward (WeDLM).
GRAPH_MODES: Counter = Counter()
WINDOWS: list[int] = []


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["exact", "shape"])
    parser.add_argument("--json", required=True, type=Path, help="where the result goes (also printed)")
    parser.add_argument("--cpu", action="store_true", help="a check of this script on the CPU machine")
    parser.add_argument("--check", action="store_true", help="import what the part needs, then stop")
    exact = parser.add_argument_group("exact")
    exact.add_argument("--prompts", type=int, default=32, help="held-out arithmetic chats")
    exact.add_argument("--max-num-seqs", type=int, default=8, help="requests at a time")
    exact.add_argument("--max-tokens", type=int, default=64)
    exact.add_argument("--canvas-widths", default="32,8",
                       help="each plain prompt's canvas in turn (diffusion_canvas_length; 2 W rows: W 16, W 4)")
    exact.add_argument("--kinds", default="plain,plain,lossless,ar",
                       help="each prompt's request kind in turn (lossless and ar: AR's tokens expected)")
    shape = parser.add_argument_group("shape")
    shape.add_argument("--modes", default="ar,ar-sync,wedlm", help=f"engines, in turn: {', '.join(SHAPE_MODES)}")
    shape.add_argument("--shape", default="qwen3-8b", help="benchmarks.step_cost.SHAPES (tiny: the --cpu check)")
    shape.add_argument("--batch-sizes", default="1,64")
    shape.add_argument("--lengths", default="64,192", help="the two output lengths whose difference is timed")
    shape.add_argument("--prompt-tokens", type=int, default=128)
    shape.add_argument("--repeats", type=int, default=3)
    shape.add_argument("--taus", default="inf,0.4", help="WeDLM thresholds, on one engine")
    shape.add_argument("--canvases", default="one-row,w8", help="narrower canvases at tau inf (none: '')")
    shape.add_argument("--max-capture-size", type=int, help="vLLM's max_cudagraph_capture_size (default: its own)")
    shape.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    shape.add_argument("--ar-json", type=Path, help="AR rows of an earlier call on this machine, for the ratios")
    shape.add_argument("--one", help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in SHAPE_MODES]:
        parser.error(f"unknown modes {unknown}")
    if unknown := [t for t in args.taus.split(",") if t not in TAUS]:
        parser.error(f"unknown taus {unknown}: {', '.join(TAUS)}")
    return args


def setup(cpu: bool) -> None:
    """Before vLLM is imported: the engine in this process, no plugin but the V2 binding."""
    sys.path.insert(0, str(ROOT))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_PLUGINS", "")
    if cpu:
        sys.path.insert(0, str(ROOT / "tests" / "v034"))
        os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", VLLM_TARGET_DEVICE="cpu")


def start_counting() -> None:
    """Count the graph mode of every step (vLLM 0.34's runner asks dispatch_cg_and_sync_dp each
    step) and the windows of every WeDLM forward."""
    from vllm.v1.worker.gpu import model_runner

    from vllm_wedlm.v2.model_state import WeDLMModelState

    dispatch, prepare = model_runner.dispatch_cg_and_sync_dp, WeDLMModelState.prepare_inputs

    def counted_dispatch(*args, **kwargs):
        desc, state = dispatch(*args, **kwargs)
        GRAPH_MODES[desc.cg_mode.name] += 1
        return desc, state

    def counted_prepare(self, input_batch, req_states):
        result = prepare(self, input_batch, req_states)
        WINDOWS.append(0 if self.step is None else len(self.step.slots))
        return result

    model_runner.dispatch_cg_and_sync_dp = counted_dispatch
    WeDLMModelState.prepare_inputs = counted_prepare


def engine(model: str, cpu: bool, **settings):
    from vllm import LLM

    from vllm_wedlm.v2.registration import register

    if cpu:
        import cpu_engine

        cpu_engine.install()
        settings = {**settings, **cpu_engine.ENGINE_ARGS}
        settings.pop("gpu_memory_utilization", None)
    register()
    start_counting()
    started = time.perf_counter()
    llm = LLM(model=model, disable_log_stats=False, **settings)  # stats: per-request first-token latency
    return llm, round(time.perf_counter() - started, 1)


def wedlm_settings(max_num_seqs: int, max_capture: int | None = None) -> dict:
    compilation = {} if max_capture is None else {"compilation_config": {"max_cudagraph_capture_size": max_capture}}
    return dict(diffusion_config={"canvas_length": 2 * W}, scheduler_cls="vllm_wedlm.v2.scheduler.WeDLMScheduler",
                async_scheduling=False, max_num_seqs=max_num_seqs, **compilation)


def what_ran(llm) -> dict:
    import torch
    import vllm

    config = llm.llm_engine.vllm_config
    backends = llm.collective_rpc(lambda worker: sorted({g.backend.get_name() for groups in
                                                         worker.model_runner.attn_groups for g in groups}))[0]
    return {"vllm": vllm.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "cudagraph_mode": str(getattr(config.compilation_config.cudagraph_mode, "name", None)),
            "max_cudagraph_capture_size": config.compilation_config.max_cudagraph_capture_size,
            "attention_backends": backends,
            "async_scheduling": bool(config.scheduler_config.async_scheduling)}


def ttft(outputs) -> dict:
    latencies = [o.metrics.first_token_latency for o in outputs if o.metrics is not None]
    if not latencies:
        return {"ttft_ms": None}
    return {"ttft_ms": round(statistics.median(latencies) * 1e3, 2), "ttft_ms_max": round(max(latencies) * 1e3, 2)}


def exact(args: argparse.Namespace) -> dict:
    from vllm import SamplingParams

    from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
    from vllm_wedlm.core import WeDLMParams
    from vllm_wedlm.engine_settings import engine_kwargs
    from vllm_wedlm.evaluation import held_out_tasks
    from vllm_wedlm.models.transformers_body import load_transformers_model
    from vllm_wedlm.reference.decoder import ReferenceDecoder, StopRule
    from vllm_wedlm.training.data.tasks import chat_prompt

    if args.check:
        return {}
    config = json.loads((MICRO_CHECKPOINT / "config.json").read_text())
    stop = sorted(json.loads((MICRO_CHECKPOINT / "generation_config.json").read_text())["eos_token_id"])
    llm, start_s = engine(str(MICRO_CHECKPOINT), args.cpu, **engine_kwargs(dtype="float32"),
                          **wedlm_settings(args.max_num_seqs))
    tokenizer = llm.get_tokenizer()
    tasks = held_out_tasks(args.prompts, ("arithmetic",), max_number=19)["arithmetic"]
    prompts = [chat_prompt(tokenizer, t) for t in tasks]
    widths, kinds = [int(w) for w in args.canvas_widths.split(",")], args.kinds.split(",")
    kind = [kinds[i % len(kinds)] for i in range(len(prompts))]
    plain = [i for i, k in enumerate(kind) if k == "plain"]
    canvas = [widths[plain.index(i) % len(widths)] if k == "plain" else 2 * W for i, k in enumerate(kind)]
    extra = {"plain": lambda c: {"diffusion_canvas_length": c}, "lossless": lambda c: {"wedlm_lossless": True},
             "ar": lambda c: {"wedlm_decoding": "ar"}}
    params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens, stop_token_ids=stop,
                             extra_args=extra[k](c)) for k, c in zip(kind, canvas, strict=True)]
    GRAPH_MODES.clear()
    WINDOWS.clear()
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - began
    model = load_transformers_model(MICRO_CHECKPOINT)
    reference = {c: ReferenceDecoder(model, mask_token_id=config["mask_token_id"], window_size=max(1, c // 2))
                 for c in set(canvas)}
    equal, tokens, first_mismatch = Counter(), 0, None
    for prompt, output, c, k in zip(prompts, outputs, canvas, kind, strict=True):
        # A lossless or AR request's expected tokens are AR's: the reference's lossless output.
        expected = reference[c].generate(tokenizer(prompt)["input_ids"],
                                         StopRule(max_tokens=args.max_tokens, stop_token_ids=frozenset(stop)),
                                         params=WeDLMParams(lossless=k != "plain")).token_ids
        got = list(output.outputs[0].token_ids)
        equal[f"W{max(1, c // 2)}" if k == "plain" else k] += got == expected
        tokens += len(got)
        if got != expected and first_mismatch is None:
            first_mismatch = {"prompt": prompt, "canvas": c, "expected": expected, "got": got}
    return {"part": "exact", "model": "micro", "dtype": "float32", "window_size": W, "canvas_length": 2 * W,
            "canvas_widths": widths, "kinds": kinds, "prompts": len(prompts), "max_num_seqs": args.max_num_seqs,
            "equal_to_reference": dict(equal), "token_exact": sum(equal.values()) == len(prompts),
            "first_mismatch": first_mismatch, "output_tokens": tokens,
            "seconds": round(seconds, 2), "tok_s": round(tokens / seconds, 1), "engine_start_s": start_s,
            "steps": sum(GRAPH_MODES.values()), "graph_modes": dict(GRAPH_MODES),
            "window_forwards": sum(WINDOWS), **ttft(outputs), **what_ran(llm)}


#: Each request's (max_tokens, diffusion_canvas_length or None) for a batch of n asked for max_tokens.
CANVASES = {
    None: lambda n, max_tokens: [(max_tokens, None)] * n,
    # One row a forward, a token each two: a 32nd of the tokens runs the steps W 16 windows that fill
    # every mask take (max_tokens / 16 and one).
    "one-row": lambda n, max_tokens: [(max(1, max_tokens // 32), 1)] + [(max_tokens, None)] * (n - 1),
    "w8": lambda n, max_tokens: [(max_tokens, W)] * n,
}


def set_tau(llm, tau: float) -> None:
    """The WeDLM threshold of the requests added from now on (the server's default knobs, over which
    the binding reads a request's own)."""
    import dataclasses

    from vllm_wedlm.core.params import WeDLMParams

    def apply(worker) -> None:
        state = worker.model_runner.model_state
        state.settings = dataclasses.replace(state.settings, params=WeDLMParams(entropy_threshold=tau))

    llm.collective_rpc(apply)


def shape_one(args: argparse.Namespace, mode: str) -> list[dict]:
    """One engine (``mode``) on the shape: a row per threshold and batch size."""
    import numpy as np
    from vllm import SamplingParams

    from benchmarks.modes import token_budget
    from benchmarks.step_cost import write_shape

    if args.check:
        return []
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    n1, n2 = (int(n) for n in args.lengths.split(","))
    model = write_shape(Path(tempfile.mkdtemp()) / args.shape, args.shape)
    settings = dict(load_format="dummy", seed=0, max_model_len=args.prompt_tokens + n2 + 2 * W + 16,
                    max_num_batched_tokens=token_budget(max(batch_sizes), W),
                    gpu_memory_utilization=args.gpu_memory_utilization)
    if mode == "wedlm":
        settings.update(wedlm_settings(max(batch_sizes), args.max_capture_size))
    else:  # vLLM's own Qwen3 on the same config: the stock AR engine
        settings.update(hf_overrides={"architectures": ["Qwen3ForCausalLM"]}, max_num_seqs=max(batch_sizes))
        if args.max_capture_size:
            settings["compilation_config"] = {"max_cudagraph_capture_size": args.max_capture_size}
        if mode == "ar-sync":
            settings["async_scheduling"] = False
    llm, start_s = engine(str(model), args.cpu, **settings)
    engine_facts = {"engine_start_s": start_s, **what_ran(llm)}
    rng = np.random.default_rng(0)
    vocab = llm.llm_engine.model_config.get_vocab_size()

    def run(prompts: list[list[int]], max_tokens: int, canvas: str | None = None) -> tuple[float, int, Counter, list]:
        """(seconds, steps, steps by graph mode, outputs) of one generate call; ``canvas``: the
        requests' narrower canvases (CANVASES)."""
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False,
                                 extra_args={"diffusion_canvas_length": c} if c else None)
                  for n, c in CANVASES[canvas](len(prompts), max_tokens)]
        before = Counter(GRAPH_MODES)
        began = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - began
        modes = GRAPH_MODES - before
        return seconds, sum(modes.values()), modes, outputs

    points = [(None, None)]  # (tau, canvas)
    if mode == "wedlm":
        points = [(tau, None) for tau in args.taus.split(",")]
        points += [("inf", canvas) for canvas in args.canvases.split(",") if canvas]
    rows = []
    for tau_name, canvas in points:
        if tau_name is not None:
            set_tau(llm, TAUS[tau_name])
        for batch in batch_sizes:
            if canvas == "one-row" and batch < 2:
                continue
            prompts = rng.integers(0, min(vocab, 1000), (batch, args.prompt_tokens)).tolist()
            run(prompts, 8, canvas)  # warm-up at this batch size
            steps_ms, tokens_per_step, tok_s, modes, firsts = [], [], [], Counter(), []
            for _ in range(args.repeats):
                t1, s1, m1, _ = run(prompts, n1, canvas)
                t2, s2, m2, outputs = run(prompts, n2, canvas)
                steps_ms.append((t2 - t1) / (s2 - s1) * 1e3)
                tokens_per_step.append((n2 - n1) / (s2 - s1))
                tok_s.append(batch * (n2 - n1) / (t2 - t1))
                modes += m1 + m2
                firsts.append(ttft(outputs))  # of the longer run: prefill and the first window forward(s)
            ttfts = [f["ttft_ms"] for f in firsts if f["ttft_ms"] is not None]
            name = mode if tau_name is None else f"wedlm:{tau_name}" + (f"+{canvas}" if canvas else "")
            rows.append({"mode": name, "batch_size": batch,
                         "step_ms": round(statistics.median(steps_ms), 3),
                         "step_ms_spread": [round(min(steps_ms), 3), round(max(steps_ms), 3)],
                         "tokens_per_step": round(statistics.median(tokens_per_step), 3),
                         "output_tok_s": round(statistics.median(tok_s), 1),
                         "ttft_ms": statistics.median(ttfts) if ttfts else None,
                         "ttft_ms_max": max((f["ttft_ms_max"] for f in firsts if "ttft_ms_max" in f), default=None),
                         "graph_modes": dict(modes), "repeats": args.repeats, **engine_facts})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def with_ratios(rows: list[dict], ar_rows: list[dict]) -> list[dict]:
    """Each row's tok/s and TTFT against the AR engine's (``ar``, vLLM's default scheduling; and
    ``ar-sync``) at its batch size."""
    for ar_mode in ("ar", "ar-sync"):
        ar = {r["batch_size"]: r for r in ar_rows if r["mode"] == ar_mode}
        for row in rows:
            base = ar.get(row["batch_size"])
            if base and row["mode"] != ar_mode:
                row[f"tok_s_vs_{ar_mode}"] = round(row["output_tok_s"] / base["output_tok_s"], 3)
                if row["ttft_ms"] and base["ttft_ms"]:
                    row[f"ttft_vs_{ar_mode}"] = round(row["ttft_ms"] / base["ttft_ms"], 3)
    return rows


def shape(args: argparse.Namespace) -> dict:
    """Each mode in a child process (a clean GPU for each engine), then the ratios."""
    if args.one or args.check:
        return {"rows": shape_one(args, args.one or "wedlm")}
    rows = []
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            child = [sys.executable, __file__, *strip_json(sys.argv[1:]), "--json", str(out), "--one", mode]
            done = subprocess.run(child)
            if done.returncode or not out.exists():
                rows.append({"mode": mode, "failed": done.returncode})
                continue
            rows += json.loads(out.read_text())["rows"]
    ar_rows = [r for r in rows if r.get("mode", "").startswith("ar") and "failed" not in r]
    if args.ar_json:
        ar_rows += json.loads(args.ar_json.read_text())["rows"]
    return {"part": "shape", "shape": args.shape, "window_size": W, "lengths": args.lengths,
            "prompt_tokens": args.prompt_tokens,
            "rows": with_ratios([r for r in rows if "failed" not in r], ar_rows) + [r for r in rows if "failed" in r]}


def strip_json(argv: list[str]) -> list[str]:
    """``argv`` without its --json (and --ar-json) options, which a child of ``shape`` is given anew."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--json", "--ar-json"):
            skip = True
        elif not arg.startswith(("--json=", "--ar-json=")):
            kept.append(arg)
    return kept


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    setup(args.cpu)
    import vllm  # noqa: F401  (after setup: the engine's settings are read at import)

    from vllm_wedlm.v2 import model, model_state, registration, scheduler  # noqa: F401

    result = exact(args) if args.part == "exact" else shape(args)
    if args.check:
        print(f"v034_spike {args.part}: imports and arguments ok")
        return
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result)[:4000])


if __name__ == "__main__":
    main()
