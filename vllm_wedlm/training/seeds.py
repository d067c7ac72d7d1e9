"""Train a recipe with several seeds (and variants of it), evaluate each in vLLM, report the spread.

    python -m vllm_wedlm.training.seeds OUT --recipe micro --seeds 0-5 \\
        --variant base= --variant tail="--suffix-mask-prob 0.5" --stage all --parallel 8

A bound asserted on one trained model is only as good as the spread of the recipe that made it:
seed variance (data order, masks, initial weights) is a fair stand-in for the differences
between machines, whose kernels round differently. Each run is a plain ``python -m
vllm_wedlm.training`` / ``python -m vllm_wedlm.evaluation`` subprocess, ``--parallel`` at a time
(on one GPU, several small models train and evaluate side by side). Stages can run separately
(``--stage train``, then ``--stage evaluate``, then ``--stage report``), each skipping what is
already done, so a long sweep fits several short machine leases.

Layout: ``OUT/VARIANT/seedN/`` (a checkpoint with training.json), ``.../evaluation.json``,
``OUT/summary.json`` (per run and per variant: median, min, max of each metric).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

METRICS = (
    ("arithmetic", "ar", "accuracy"),
    ("arithmetic", "wedlm", "accuracy"),
    ("arithmetic", "wedlm", "tokens_per_forward"),
    ("counting", "wedlm", "tokens_per_forward"),
)


def _seeds(text: str) -> list[int]:
    """``0-5`` or ``0,3,7`` -> a list of seeds."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def _variants(specs: list[str]) -> dict[str, list[str]]:
    """``name=--flag value`` -> {name: extra training arguments}."""
    variants = {}
    for spec in specs:
        name, _, args = spec.partition("=")
        if not name.isidentifier():
            raise SystemExit(f"--variant: expected NAME=ARGS with a plain NAME, got {spec!r}")
        variants[name] = shlex.split(args)
    return variants or {"base": []}


def _run(command: list[str], log: Path) -> int:
    """One subprocess with its output in ``log``; two CPU threads each, so runs share the cores."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode


def _in_parallel(jobs: list[tuple[str, list[str], Path]], parallel: int) -> None:
    """Run (label, command, log) jobs, ``parallel`` at a time, printing progress and a time estimate."""
    if not jobs:
        return
    start, done = time.perf_counter(), 0

    def one(job):
        label, command, log = job
        code = _run(command, log)
        return label, code, log

    with ThreadPoolExecutor(parallel) as pool:
        for label, code, log in pool.map(one, jobs):
            done += 1
            elapsed = time.perf_counter() - start
            eta = elapsed / done * (len(jobs) - done)
            state = "ok" if code == 0 else f"FAILED (exit {code}, see {log})"
            print(f"[{done}/{len(jobs)}] {label}: {state}  {elapsed:.0f}s elapsed, ~{eta:.0f}s left",
                  file=sys.stderr, flush=True)


def train_stage(out: Path, recipe: str, seeds: list[int], variants: dict[str, list[str]], parallel: int) -> None:
    jobs = []
    for name, extra in variants.items():
        for seed in seeds:
            run = out / name / f"seed{seed}"
            if (run / "training.json").exists():
                continue
            run.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "vllm_wedlm.training", str(run), "--recipe", recipe,
                       "--seed", str(seed), *extra]
            jobs.append((f"train {name}/seed{seed}", command, run.parent / f"seed{seed}.train.log"))
    _in_parallel(jobs, parallel)


def evaluate_stage(out: Path, seeds: list[int], variants: dict[str, list[str]], parallel: int,
                   evaluation_args: list[str]) -> None:
    jobs = []
    for name in variants:
        for seed in seeds:
            run = out / name / f"seed{seed}"
            if not (run / "training.json").exists() or (run / "evaluation.json").exists():
                continue
            command = [sys.executable, "-m", "vllm_wedlm.evaluation", str(run), "--kinds", "counting,arithmetic",
                       "--json", str(run / "evaluation.json"), *evaluation_args]
            jobs.append((f"evaluate {name}/seed{seed}", command, run.parent / f"seed{seed}.eval.log"))
    _in_parallel(jobs, parallel)


def _metric(evaluation: dict, kind: str, mode: str, name: str) -> float:
    return evaluation["modes"][mode][kind][name]


def summarise(out: Path, seeds: list[int], variants: dict[str, list[str]]) -> dict:
    """Per run and per variant (median / min / max over seeds) of each metric in METRICS."""
    summary: dict = {"variants": {}}
    for name, extra in variants.items():
        runs = {}
        for seed in seeds:
            path = out / name / f"seed{seed}" / "evaluation.json"
            if path.exists():
                evaluation = json.loads(path.read_text())
                row = {"/".join(m): _metric(evaluation, *m) for m in METRICS}
                row["gap"] = row["arithmetic/ar/accuracy"] - row["arithmetic/wedlm/accuracy"]
                runs[seed] = row
        spread = {}
        for key in (*("/".join(m) for m in METRICS), "gap"):
            values = [r[key] for r in runs.values()]
            if values:
                spread[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        summary["variants"][name] = {"training_args": extra, "runs": runs, "spread": spread}
    return summary


def _spread_cell(spread: dict, key: str, number_format: str) -> str:
    """``median (min..max)`` of one metric."""
    return "{} ({}..{})".format(*(format(spread[key][s], number_format) for s in ("median", "min", "max")))


def report(summary: dict) -> str:
    lines = ["| variant | seed | AR arithmetic acc | WeDLM arithmetic acc | gap | WeDLM arithmetic TPF "
             "| WeDLM counting TPF |",
             "|---|---|---|---|---|---|---|"]
    for name, entry in summary["variants"].items():
        for seed, row in entry["runs"].items():
            lines.append(f"| {name} | {seed} | {row['arithmetic/ar/accuracy']:.3f} "
                         f"| {row['arithmetic/wedlm/accuracy']:.3f} "
                         f"| {row['gap']:+.3f} | {row['arithmetic/wedlm/tokens_per_forward']:.2f} "
                         f"| {row['counting/wedlm/tokens_per_forward']:.2f} |")
        spread = entry["spread"]
        if spread:
            lines.append(f"| **{name}** | median (min..max) | {_spread_cell(spread, 'arithmetic/ar/accuracy', '.3f')} "
                         f"| {_spread_cell(spread, 'arithmetic/wedlm/accuracy', '.3f')} "
                         f"| {_spread_cell(spread, 'gap', '+.3f')} "
                         f"| {_spread_cell(spread, 'arithmetic/wedlm/tokens_per_forward', '.2f')} "
                         f"| {_spread_cell(spread, 'counting/wedlm/tokens_per_forward', '.2f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train a recipe over several seeds and report the spread.")
    parser.add_argument("out_dir")
    parser.add_argument("--recipe", default="micro")
    parser.add_argument("--seeds", default="0-4", help="0-4 or 0,3,7")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                        help="extra `python -m vllm_wedlm.training` arguments of one variant (repeatable)")
    parser.add_argument("--stage", choices=("train", "evaluate", "report", "all"), default="all")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    # A fixed W: the adaptive window (the engine's default) sizes windows from step times, which runs
    # side by side on one GPU disturb; a seed's spread must be the recipe's, not the machine's.
    parser.add_argument("--evaluation-args", default="--per-kind 40 --window-size 16",
                        help="extra `python -m vllm_wedlm.evaluation` arguments")
    args = parser.parse_args(argv)
    out, seeds, variants = Path(args.out_dir), _seeds(args.seeds), _variants(args.variant)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage in ("train", "all"):
        train_stage(out, args.recipe, seeds, variants, args.parallel)
    if args.stage in ("evaluate", "all"):
        evaluate_stage(out, seeds, variants, args.parallel, shlex.split(args.evaluation_args))
    summary = summarise(out, seeds, variants)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(report(summary))


if __name__ == "__main__":
    main()
