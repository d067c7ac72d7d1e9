"""WeDLM serving on several GPUs of one host: tensor and data parallel against one GPU.

    python scripts/multi_gpu_check.py [--model DIR] [--configs tp1,tp2,dp2] [--out FILE.json]

Starts one real ``vllm serve MODEL --decoding wedlm`` per configuration (engine defaults, float32,
FlexAttention so that float32 stays exact, no scheduling flag) and sends the same greedy prompts
all at once, three times, in each request mode: plain WeDLM, lossless WeDLM and per-request AR
(``vllm_xargs``). A configuration names its parallelism and, optionally, the scheduling it forces:
``tp2`` (``--tensor-parallel-size 2``), ``dp2`` (``--data-parallel-size 2``), ``tp2+async``
(``--async-scheduling``), ``tp2+sync`` (``--no-async-scheduling``).

Checks, exit status 1 when one fails:
* every configuration returns the first one's text for every prompt and mode (float32 greedy:
  tensor parallel sums in another order, which must not change a token);
* lossless and per-request AR equal each other (both are AR's tokens) in every configuration;
* with data parallel, every replica ran WeDLM windows (``vllm:diffusion_num_denoising_steps_total``
  per ``engine`` label of ``/metrics``) and finished requests.

Writes, per configuration and mode, output tokens per second over the three passes (median and
spread; the prompts go out together, so this is throughput at concurrency = number of prompts),
and tokens per forward from the server's counters.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_wedlm.engine_settings import serve_args  # noqa: E402
from vllm_wedlm.server_process import running_server  # noqa: E402

MODES = {"wedlm": {}, "lossless": {"wedlm_lossless": True}, "ar": {"wedlm_decoding": "ar"}}
PASSES = 3


def parse_config(name: str) -> list[str]:
    """``vllm serve`` flags of a configuration name (``tp2``, ``dp2``, ``tp1+async`` ...)."""
    match = re.fullmatch(r"(tp|dp)(\d+)(?:\+(async|sync))?", name)
    if not match:
        raise SystemExit(f"unknown configuration {name!r}: tpN or dpN, optionally +async or +sync")
    kind, size, scheduling = match.groups()
    flags = ["--tensor-parallel-size" if kind == "tp" else "--data-parallel-size", size]
    if scheduling:
        flags.append("--async-scheduling" if scheduling == "async" else "--no-async-scheduling")
    return flags


def prompts(model: Path, count: int) -> list[str]:
    """``count`` held-out arithmetic chats, rendered with the model's chat template (the benchmarks'
    workload: the tasks the bundled models were trained on, never seen in training)."""
    from transformers import AutoTokenizer

    from benchmarks.workload import build, take

    return [p.text for p in take(build(AutoTokenizer.from_pretrained(model), ["arithmetic"], count)["arithmetic"],
                                 count)]


def complete(base: str, model: str, prompt: str, xargs: dict, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "vllm_xargs": xargs}
    response = requests.post(f"{base}/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    choice = response.json()
    return {"text": choice["choices"][0]["text"], "tokens": choice["usage"]["completion_tokens"]}


def counters(base: str) -> dict[str, dict[str, float]]:
    """{metric: {engine label: value}} of the counters this check reads."""
    wanted = ("vllm:diffusion_num_denoising_steps_total", "vllm:diffusion_num_committed_tokens_total",
              "vllm:request_success_total")
    found: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        if name in found:
            engine = re.search(r'engine="(\d+)"', line)
            key = engine.group(1) if engine else "0"
            found[name][key] = found[name].get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def run_config(model: Path, name: str, texts: list[str], max_tokens: int, logs: Path) -> dict:
    flags = ["--decoding", "wedlm", "--dtype", "float32", "--seed", "0", *serve_args("float32"), *parse_config(name)]
    result: dict = {"flags": flags, "modes": {}}
    with running_server(model, *flags, log_path=logs / f"serve-{name}.log") as base:
        (served,) = requests.get(f"{base}/v1/models", timeout=30).json()["data"]
        for mode, xargs in MODES.items():
            before = counters(base)
            rates, outputs = [], None
            for _ in range(PASSES):
                begin = time.perf_counter()
                with ThreadPoolExecutor(len(texts)) as pool:
                    done = list(pool.map(complete, [base] * len(texts), [served["id"]] * len(texts), texts,
                                         [xargs] * len(texts), [max_tokens] * len(texts)))
                rates.append(sum(d["tokens"] for d in done) / (time.perf_counter() - begin))
                if outputs is not None and [d["text"] for d in done] != outputs:
                    raise AssertionError(f"{name} {mode}: greedy outputs differ between passes")
                outputs = [d["text"] for d in done]
            after = counters(base)
            delta = {metric: {e: after[metric].get(e, 0.0) - before[metric].get(e, 0.0) for e in after[metric]}
                     for metric in after}
            forwards = sum(delta["vllm:diffusion_num_denoising_steps_total"].values())
            committed = sum(delta["vllm:diffusion_num_committed_tokens_total"].values())
            result["modes"][mode] = {
                "tokens_per_s": statistics.median(rates), "tokens_per_s_runs": rates,
                "tokens_per_forward": committed / forwards if forwards else None,
                "forwards_per_engine": delta["vllm:diffusion_num_denoising_steps_total"],
                "requests_per_engine": delta["vllm:request_success_total"],
                "outputs": outputs,
            }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "vllm_wedlm" / "checkpoints" / "micro")
    parser.add_argument("--configs", default="tp1,tp2,dp2")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("multi-gpu.json"))
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.model, args.prompts)
    names = args.configs.split(",")
    results, failures = {}, []
    summary = {"model": str(args.model), "prompts": args.prompts, "max_tokens": args.max_tokens, "passes": PASSES,
               "failures": failures, "configs": results}
    for name in names:
        args.out.write_text(json.dumps(summary, indent=1))  # what is done so far, should a time limit cut the run
        try:
            results[name] = run_config(args.model, name, texts, args.max_tokens, args.logs)
        except Exception as error:  # recorded; the other configurations still run
            failures.append(f"{name}: {error}")
            print(f"{name}: FAILED {error}", flush=True)
            continue
        modes = results[name]["modes"]
        print(name, {m: (round(v["tokens_per_s"]), v["tokens_per_forward"] and round(v["tokens_per_forward"], 2))
                     for m, v in modes.items()}, flush=True)
        if modes["lossless"]["outputs"] != modes["ar"]["outputs"]:
            failures.append(f"{name}: lossless WeDLM differs from per-request AR")
        if name.startswith("dp"):
            for metric in ("forwards_per_engine", "requests_per_engine"):
                engines = {e for e, v in modes["wedlm"][metric].items() if v > 0}
                if len(engines) < int(re.match(r"dp(\d+)", name).group(1)):
                    failures.append(f"{name}: plain WeDLM {metric} on engines {sorted(engines)} only")
    first = names[0]
    for name in names[1:]:
        if name in results and first in results:
            for mode in MODES:
                a, b = results[first]["modes"][mode]["outputs"], results[name]["modes"][mode]["outputs"]
                differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
                if differ:
                    failures.append(f"{name} {mode}: {len(differ)} of {len(a)} outputs differ from {first}'s "
                                    f"(first: prompt {differ[0]}: {a[differ[0]]!r} vs {b[differ[0]]!r})")
    args.out.write_text(json.dumps(summary, indent=1))
    print("\n".join(failures) or "all configurations agree", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
