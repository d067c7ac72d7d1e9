"""Markdown tables and plots of benchmark result files (``python -m benchmarks report``).

    python -m benchmarks report A.json [B.json ...] --out DIR   report.md: every row of every file, and plots
    python -m benchmarks report A.json [B.json ...]             one summary table per file, on stdout
    python -m benchmarks report --median A.json B.json C.json   repeated runs of one command: one table,
                                                                each cell the median of the runs [min-max]
    python -m benchmarks report --expect A.json B.json C.json   step-cost runs of the Qwen3-8B shape: what
                                                                WeDLM-8B's published speed-ups become per batch
    python -m benchmarks report --versus A.json [B.json ...]    offline or online runs of several modes (their
                                                                kinds or loads in different files): one row
                                                                per point, each mode against AR of its run
    python -m benchmarks report --windows A.json [B.json ...]   where an adaptive window's W went: the share
                                                                of windows planned at each W, per point
    python -m benchmarks report --update BENCHMARKS.md          re-render every marked block of a page
    python -m benchmarks report --check BENCHMARKS.md           exit 1 if a marked block is stale

A marked block is ``<!-- report:begin NAME: ARGS -->`` ... ``<!-- report:end NAME -->``: the text
between is what ``python -m benchmarks report ARGS`` prints, with ARGS's paths relative to the page.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

COLUMNS = {
    "offline": [("mode", "mode"), ("kind", "task"), ("structured", "structured output"), ("batch_size", "batch"),
                ("shots", "shots"),
                ("max_tokens", "max tokens"), ("prompt_tokens", "prompt tokens"), ("output_tok_s", "output tok/s"),
                ("speedup_vs_ar", "vs AR"), ("tokens_per_forward", "tokens/forward"), ("accuracy", "accuracy")],
    "online": [("mode", "mode"), ("kind", "task"), ("concurrency", "concurrency"), ("shots", "shots"),
               ("max_tokens", "max tokens"), ("output_tok_s", "output tok/s"), ("speedup_vs_ar", "vs AR"),
               ("tokens_per_forward", "tokens/forward"), ("accuracy", "accuracy"),
               ("request_tok_s_p50", "per-request tok/s p50"), ("ttft_s_p50", "TTFT p50 s"),
               ("ttft_s_p99", "TTFT p99 s"), ("latency_s_p50", "latency p50 s"), ("latency_s_p99", "latency p99 s")],
    "step-cost": [("mode", "mode"), ("window_size", "W"), ("batch_size", "batch"), ("step_ms", "ms/step"),
                  ("step_vs_ar", "step vs AR"), ("tokens_per_step", "tokens/step/request"),
                  ("output_tok_s", "output tok/s"), ("speedup_vs_ar", "vs AR")],
}
SCORED = ("counting", "arithmetic")


@dataclass(frozen=True)
class Spread:
    """A number measured several times: the median, the lowest and the highest."""

    median: float
    low: float
    high: float


def spread(values: list[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values))


def _number(value: float) -> str:
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, Spread):
        low, high = _number(value.low), _number(value.high)
        return _number(value.median) if low == high else f"{_number(value.median)} [{low}-{high}]"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def table(record: dict) -> str:
    columns = [(key, label) for key, label in COLUMNS[record["benchmark"]]
               if any(row.get(key) is not None for row in record["rows"])]
    lines = ["| " + " | ".join(label for _, label in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(key)) for key, _ in columns) + " |" for row in record["rows"]]
    return "\n".join(lines)


def write(records: list[dict], out: Path) -> Path:
    """``out/report.md`` with one section per result file and its plots beside it."""
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for index, record in enumerate(records):
        env = record.get("environment", {})
        sections.append(f"## {record['benchmark']}: {record.get('model')}\n\n`{record.get('command', '')}`\n\n"
                        f"vLLM {env.get('vllm')}, torch {env.get('torch')}, {env.get('device')}; "
                        f"{record.get('seconds')} s\n")
        for name in _plots(record, out, f"{index}-{record['benchmark']}"):
            sections.append(f"![{name}]({name})\n")
        sections.append(table(record) + "\n")
    path = out / "report.md"
    path.write_text("# Benchmark report\n\n" + "\n".join(sections))
    return path


def _plots(record: dict, out: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, names = record["rows"], []
    if record["benchmark"] == "step-cost":
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for key, ax, label in (("step_ms", axes[0], "ms per decoding step"), ("output_tok_s", axes[1], "output tok/s")):
            for series, points in _series(rows, _step_cost_series, "batch_size", key).items():
                ax.plot(*zip(*points, strict=True), marker="o", label=series)
            _log2(ax)
            ax.set(xlabel="batch size", ylabel=label)
            ax.legend(fontsize=7)
        names.append(_save(fig, out, f"{stem}-step-cost.png"))
        return names
    load = _load_key(record)
    first = rows[0]
    same = [r for r in rows if r["shots"] == first["shots"] and r["max_tokens"] == first["max_tokens"]]
    kinds = sorted({r["kind"] for r in same})
    fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for mode, points in _series([r for r in same if r["kind"] == kind and r["mode"] != "ar"],
                                    lambda r: r["mode"], load, "speedup_vs_ar").items():
            ax.plot(*zip(*points, strict=True), marker="o", label=mode)
        ax.axhline(1.0, color="grey", lw=0.8)
        _log2(ax)
        ax.set(xlabel=load.replace("_", " "), ylabel="output tok/s vs AR", title=kind)
        ax.legend(fontsize=7)
    names.append(_save(fig, out, f"{stem}-speedup.png"))
    scored = [k for k in kinds if k in SCORED and any(r.get("accuracy") is not None for r in same)]
    if scored:
        top = max(r[load] for r in same)
        fig, axes = plt.subplots(1, len(scored), figsize=(4.5 * len(scored), 3.5), squeeze=False)
        for ax, kind in zip(axes[0], scored, strict=True):
            for r in (r for r in same if r["kind"] == kind and r[load] == top):
                ax.scatter(r["accuracy"], r["output_tok_s"])
                ax.annotate(r["mode"], (r["accuracy"], r["output_tok_s"]), fontsize=7)
            ax.set(xlabel="accuracy", ylabel="output tok/s", title=f"{kind}, {load.replace('_', ' ')} {top}")
        names.append(_save(fig, out, f"{stem}-speed-vs-accuracy.png"))
    return names


def _step_cost_series(row: dict) -> str:
    return f"{row['mode']} W{row['window_size']}" if row["window_size"] else "ar"


def _log2(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


def _series(rows: list[dict], name, x: str, y: str) -> dict[str, list[tuple]]:
    series: dict[str, list[tuple]] = {}
    for row in rows:
        if row.get(y) is not None:
            series.setdefault(name(row), []).append((row[x], row[y]))
    return {k: sorted(v) for k, v in series.items()}


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


# ---- the command line ---------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``report``'s arguments, for the harness's command line and for a page's marked blocks."""
    parser.add_argument("results", nargs="*", help="result files (JSON)")
    parser.add_argument("--out", help="write DIR/report.md (every row of every file) and its plots")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--median", action="store_true",
                     help="the files are repeated runs of one command: one table, each cell the median of the "
                     "runs [min-max]")
    how.add_argument("--expect", action="store_true",
                     help="the files are step-cost runs of the Qwen3-8B shape: the speed-ups WeDLM-8B's "
                     "published numbers imply at each batch size measured (derived)")
    how.add_argument("--versus", action="store_true",
                     help="offline or online runs of several modes: one row per point (task, load), each mode's "
                     "output tok/s against AR's of the same run, with its tokens per forward")
    how.add_argument("--windows", action="store_true",
                     help="where the adaptive window's W went: windows planned at each W, per point and mode")
    how.add_argument("--update", metavar="PAGE", help="re-render every marked block of PAGE in place")
    how.add_argument("--check", metavar="PAGE", help="exit 1 if a marked block of PAGE is not what its files render")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks report")
    add_arguments(parser)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    if args.update or args.check:
        _page(Path(args.update or args.check), write_back=bool(args.update))
        return
    if not args.results:
        raise SystemExit("report: name result files (or --update / --check a page)")
    if args.out:
        if args.median or args.expect:
            raise SystemExit("report: --out writes every file's rows; it takes neither --median nor --expect")
        print(write([_load(Path(p)) for p in args.results], Path(args.out)))
        return
    try:
        print(render(args))
    except ValueError as error:  # files that do not go together
        raise SystemExit(f"report: {error}") from None


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def render(args: argparse.Namespace, base: Path = Path(".")) -> str:
    """The markdown that ``report`` prints for ``args``; result paths are relative to ``base``."""
    records = [_load(base / p) for p in args.results]
    if args.expect:
        return expectation(records, args.results)
    if args.median:
        return summary(records, args.results)
    if args.versus:
        return versus(records, args.results)
    if args.windows:
        return window_shares(records, args.results)
    return "\n\n".join(_one(record, path) for record, path in zip(records, args.results, strict=True))


def _one(record: dict, path: str) -> str:
    if record.get("benchmark") in SUMMARY:
        return summary([record], [path])
    if "configs" in record:
        return parallel_table(record, path)
    if "pipeline" in record:
        return pipeline_table(record, path)
    raise ValueError(f"{path}: not a result file that report knows")


def _files(paths: list[str]) -> str:
    return "Files: " + ", ".join(f"[`{Path(p).name}`]({p})" for p in paths) + "."


# ---- the harness's result files, one run or repeated runs ---------------------------------------

#: The columns of a summary table, fewer than ``COLUMNS``: what a reader compares.
SUMMARY = {
    "offline": [("mode", "mode"), ("kind", "task"), ("batch_size", "batch"), ("requests", "requests"),
                ("shots", "shots"), ("max_tokens", "max tokens"), ("window_size", "W"),
                ("scheduling", "scheduling"), ("output_tok_s", "output tok/s"), ("speedup_vs_ar", "vs AR"),
                ("tokens_per_forward", "tokens/forward"), ("accuracy", "accuracy")],
    "online": [("mode", "mode"), ("kind", "task"), ("concurrency", "concurrency"), ("requests", "requests"),
               ("shots", "shots"), ("max_tokens", "max tokens"), ("window_size", "W"), ("scheduling", "scheduling"),
               ("output_tok_s", "output tok/s"), ("speedup_vs_ar", "vs AR"), ("tokens_per_forward", "tokens/forward"),
               ("accuracy", "accuracy"), ("ttft_s_p50", "TTFT p50 s"), ("latency_s_p50", "latency p50 s")],
    "step-cost": [("mode", "mode"), ("window_size", "W"), ("batch_size", "batch"), ("scheduling", "scheduling"),
                  ("window_rows", "rows"), ("step_ms", "ms/step"), ("step_vs_ar", "step vs AR"),
                  ("tokens_per_step", "tokens/step/request"), ("output_tok_s", "output tok/s"),
                  ("speedup_vs_ar", "vs AR")],
}
#: What identifies a row's point: the same in every run of one command.
POINT = ("mode", "kind", "batch_size", "concurrency", "window_size", "window_tokens", "shots", "max_tokens")
#: Columns that describe the point rather than measure it (a page lists them once when all rows agree).
SETTINGS = frozenset(POINT) | {"requests", "scheduling", "window_rows", "prompt_tokens"}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge_runs(records: list[dict]) -> list[dict]:
    """The rows of repeated runs of one command, matched by point, in the first run's order. Each
    measured number becomes the ``Spread`` of the runs' values; with one run, of its timed repeats
    where the row records them (``seconds_spread``, ``step_ms_spread``)."""
    if len({r["benchmark"] for r in records}) != 1:
        raise ValueError("the runs are of different benchmarks")
    runs = [{tuple(row.get(k) for k in POINT): row for row in r["rows"]} for r in records]
    if any(run.keys() != runs[0].keys() for run in runs):
        raise ValueError("the runs measured different points")
    merged = []
    for point in runs[0]:
        rows = [run[point] for run in runs]
        merged.append({name: _merge(name, rows) for name in rows[0]})
    return merged


def _merge(name: str, rows: list[dict]):
    values = [row.get(name) for row in rows]
    if name in SETTINGS or not all(_is_number(v) for v in values):
        return values[0] if all(v == values[0] for v in values) else " / ".join(map(str, values))
    return spread(values) if len(rows) > 1 else _repeats(name, rows[0])


def _repeats(name: str, row: dict):
    """One run's value with the spread of its timed repeats, where the row records it."""
    value = row[name]
    if name == "step_ms" and row.get("step_ms_spread"):
        return Spread(value, *row["step_ms_spread"])
    if name == "output_tok_s" and row.get("seconds_spread") and row.get("output_tokens"):
        fastest, slowest = row["seconds_spread"]
        return Spread(value, row["output_tokens"] / slowest, row["output_tokens"] / fastest)
    return value


def summary(records: list[dict], paths: list[str]) -> str:
    """One table of one or more runs of one command, the settings every row shares under it."""
    rows = merge_runs(records)
    columns = [(k, label) for k, label in SUMMARY[records[0]["benchmark"]] if any(r.get(k) is not None for r in rows)]
    shared = {k: label for k, label in columns if k in SETTINGS and k != "mode" and _shared(rows, k) is not None}
    columns = [(k, label) for k, label in columns if k not in shared]
    lines = ["| " + " | ".join(label for _, label in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(k)) for k, _ in columns) + " |" for row in rows]
    notes = [_how(records), _environment(records)]
    if shared:
        notes.append("Every row: " + ", ".join(f"{label} {_shared(rows, k)}" for k, label in shared.items()) + ".")
    notes += [_commands(records), _files(paths)]
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _shared(rows: list[dict], key: str):
    """The one value that every row which has ``key`` holds, else None."""
    values = {row[key] for row in rows if row.get(key) is not None}
    return values.pop() if len(values) == 1 else None


def _how(records: list[dict]) -> str:
    repeats = sorted({row["repeats"] for r in records for row in r["rows"] if row.get("repeats")})
    within = f"the median of its {'/'.join(map(str, repeats))} timed repeats" if repeats else "one timed pass"
    if len(records) == 1:
        return f"One run; each timing is {within}" + (" [min-max]." if repeats else ".")
    return f"Median of {len(records)} runs [min-max of the runs' values]; each run's timing is {within}."


def _environment(records: list[dict]) -> str:
    envs = {tuple((r.get("environment") or {}).get(k) for k in ("device", "vllm", "torch")) for r in records}
    return " ".join(f"{device}, vLLM {vllm}, torch {torch}." for device, vllm, torch in sorted(envs, key=str))


_SCRATCH = re.compile(r" --(?:json|workdir|log-dir) \S+")


def _commands(records: list[dict]) -> str:
    """The runs' commands without the paths they wrote to (the same command, run again)."""
    commands = list(dict.fromkeys(_SCRATCH.sub("", r["command"]) for r in records if r.get("command")))
    return "Command: " + "; ".join(f"`{c}`" for c in commands) + "." if commands else ""


# ---- several modes against AR, and where W went ------------------------------------------------

def _load_key(record: dict) -> str:
    """The row key of a run's load: an offline run's batch size, an online run's concurrency."""
    return "batch_size" if record["benchmark"] == "offline" else "concurrency"


def _load_label(record: dict) -> str:
    return "batch" if _load_key(record) == "batch_size" else "concurrency"


def _points(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(task, load) -> mode -> row, over runs that measured different points (kinds, loads)."""
    if len({r["benchmark"] for r in records}) != 1 or records[0]["benchmark"] not in ("offline", "online"):
        raise ValueError("--versus and --windows take offline or online runs of one benchmark")
    points: dict[tuple, dict[str, dict]] = {}
    for record in records:
        load = _load_key(record)
        for row in record["rows"]:
            modes = points.setdefault((row["kind"], row[load]), {})
            if row["mode"] in modes:
                raise ValueError(f"{row['mode']} at {row['kind']}, {row[load]} is in two files")
            modes[row["mode"]] = row
    return points


def versus(records: list[dict], paths: list[str]) -> str:
    """One row per point: AR's output tok/s [its timed repeats' spread], then each other mode's
    tok/s over AR's of the same run (the medians' ratio) with its tokens per forward, and the
    accuracy of every mode where the task is scored."""
    points = _points(records)
    modes = list(dict.fromkeys(row["mode"] for record in records for row in record["rows"] if row["mode"] != "ar"))
    load = _load_label(records[0])
    scored = any(row.get("accuracy") is not None for by_mode in points.values() for row in by_mode.values())
    header = ["task", load, "AR tok/s", *(f"{m} vs AR (TPF)" for m in modes)]
    if scored:
        header.append("accuracy: " + " / ".join(["ar", *modes]))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (kind, size), by_mode in points.items():
        ar = by_mode["ar"]
        cells = [kind, str(size), _cell(_repeats("output_tok_s", ar))]
        for mode in modes:
            row = by_mode.get(mode)
            cells.append("" if row is None else
                         f"{row['output_tok_s'] / ar['output_tok_s']:.3g}x ({_cell(row.get('tokens_per_forward'))})")
        if scored:
            scores = [by_mode.get(m, {}).get("accuracy") for m in ["ar", *modes]]
            cells.append("" if all(a is None for a in scores) else " / ".join(_cell(a) for a in scores))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"One run per file; each timing is the median of its {ar.get('repeats')} interleaved repeats; "
             "a ratio is of the medians of one run.", _environment(records), _commands(records), _files(paths)]
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _share(fraction: float) -> str:
    percent = f"{100 * fraction:.0f}"
    return "" if not fraction else "<1%" if percent == "0" else f"{percent}%"


#: W classes of the ``--windows`` table: (label, lowest, highest).
W_CLASSES = (("W 0", 0, 0), ("W 1", 1, 1), ("W 2-3", 2, 3), ("W 4-7", 4, 7), ("W 8-11", 8, 11), ("W 12-15", 12, 15),
             ("W 16", 16, 16))


def window_shares(records: list[dict], paths: list[str]) -> str:
    """Per point and adaptive mode: the windows its engine planned (in the last timed repeat) and the
    share at each class of W (``W_CLASSES``; W 0: an AR step of the batch, or a window of its run
    alone on fixed rows)."""
    points = _points(records)
    load = _load_label(records[0])
    header = ["task", load, "mode", "windows", *(label for label, _, _ in W_CLASSES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (kind, size), by_mode in points.items():
        for mode, row in by_mode.items():
            counts = {int(w): n for w, n in (row.get("window_histogram") or {}).items()}
            if not counts:
                continue
            if max(counts) > W_CLASSES[-1][2]:
                raise ValueError(f"{mode}: a W above {W_CLASSES[-1][2]} ({max(counts)})")
            total = sum(counts.values())
            shares = [sum(n for w, n in counts.items() if low <= w <= high) / total for _, low, high in W_CLASSES]
            lines.append("| " + " | ".join([kind, str(size), mode, str(total),
                                            *(_share(x) for x in shares)]) + " |")
    return "\n".join(lines) + "\n\n" + _files(paths)


# ---- scripts/multi_gpu_check.py's result files --------------------------------------------------

MULTI_GPU_MODES = (("wedlm", "plain WeDLM tok/s"), ("lossless", "lossless tok/s"), ("ar", "per-request AR tok/s"))


def parallel_table(record: dict, path: str) -> str:
    """One row per configuration: throughput of each request mode over the passes, and whether its
    texts are the first configuration's."""
    configs = record["configs"]
    first = next(iter(configs))
    header = ["configuration", "scheduling", *(label for _, label in MULTI_GPU_MODES),
              "tokens/forward plain / lossless", f"texts equal to {first}'s", "lossless = AR"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, config in configs.items():
        modes = config["modes"]
        cells = [name, _scheduling(config["flags"])]
        cells += [_cell(spread(modes[mode]["tokens_per_s_runs"])) for mode, _ in MULTI_GPU_MODES]
        cells.append(" / ".join(_cell(modes[mode]["tokens_per_forward"]) for mode in ("wedlm", "lossless")))
        cells.append("" if name == first else _equal_texts(configs[first]["modes"], modes))
        cells.append(_same(modes["lossless"]["outputs"], modes["ar"]["outputs"]))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"Median of {record['passes']} passes [min-max]; {record['prompts']} prompts sent together, greedy, "
             f"max_tokens {record['max_tokens']}, model `{Path(record['model']).name}`.",
             f"Command: `python scripts/multi_gpu_check.py --configs {','.join(configs)}`.", _files([path])]
    if record.get("failures"):
        notes.insert(0, "Failed checks: " + "; ".join(record["failures"]) + ".")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _scheduling(flags: list[str]) -> str:
    if "--async-scheduling" in flags:
        return "async (flag)"
    return "sync (flag)" if "--no-async-scheduling" in flags else "default"


def _same(a: list[str], b: list[str]) -> str:
    return f"{sum(x == y for x, y in zip(a, b, strict=True))} / {len(a)}"


def _equal_texts(first: dict, modes: dict) -> str:
    counts = {mode: _same(first[mode]["outputs"], modes[mode]["outputs"]) for mode, _ in MULTI_GPU_MODES}
    if len(set(counts.values())) == 1:
        return f"{counts['wedlm']}, every mode"
    return ", ".join(f"{mode} {count}" for mode, count in counts.items())


# ---- vllm_wedlm.training.pipeline's evaluation files --------------------------------------------

def pipeline_table(record: dict, path: str) -> str:
    """Per task kind: AR throughput of the source and the trained model, and for every WeDLM engine
    its tokens per forward and its speed relative to the trained model decoded AR."""
    runs = record["runs"]
    names = sorted(runs, key=lambda n: (n != "source", n != "trained"))  # the AR runs first, else as stored
    header = ["kind", *(_run_label(n) for n in names)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in runs["trained"]:
        base = runs["trained"][kind]["tokens_per_second"]
        lines.append("| " + " | ".join([kind, *(_pipeline_cell(runs[n].get(kind), base) for n in names)]) + " |")
    repeats = record.get("repeats", 1)
    timing = (f"median of {repeats} timed repeats; [range]: WeDLM's slowest and fastest over AR's median"
              if repeats > 1 else "one timed pass")
    notes = [f"AR cells: output tok/s; WeDLM cells: tokens per forward, then output tok/s over the trained model's "
             f"AR ({timing}); acc: accuracy, pass@1: HumanEval.",
             f"{record['per_kind']} held-out prompts per kind submitted together, greedy, max_tokens "
             f"{record['max_tokens']}, {record['dtype']}.", _files([path])]
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _run_label(name: str) -> str:
    if name in ("source", "trained"):
        return f"{name} AR"
    return name.removeprefix("trained-").replace("wedlm-", "WeDLM tau ").replace("lossless-", "lossless tau ")


def _pipeline_cell(cell: dict | None, base: float) -> str:
    if cell is None:
        return ""
    score = "".join(f", {label} {cell[key]:.3f}" for key, label in (("accuracy", "acc"), ("pass@1", "pass@1"))
                    if cell.get(key) is not None)
    if cell["tokens_per_forward"] == 1.0:
        return f"{_number(cell['tokens_per_second'])} tok/s{score}"
    low, high = cell.get("tokens_per_second_range", [cell["tokens_per_second"]] * 2)
    ratio = _cell(Spread(cell["tokens_per_second"] / base, low / base, high / base)).replace(" ", "x ", 1)
    return f"{cell['tokens_per_forward']:.2f}, {ratio}{'' if '[' in ratio else 'x'}{score}"


# ---- what to expect from WeDLM-8B ---------------------------------------------------------------

#: WeDLM's published speed-ups over vLLM decoding Qwen3-8B AR, per task (low, high): the WeDLM README
#: and the paper's Fig. 5a, as the project's research notes transcribe them (wedlm.md section 6,
#: "Speed"; anchors-2026-11.md section 0, item 5, and 3.3). Hardware not stated; batch size not
#: stated, most likely one request.
PUBLISHED = (
    ("counting, sequential text", 10.0, 10.0, "README: up to 10x"),
    ("math (GSM8K, MATH)", 3.0, 6.0, "README: 3-6x"),
    ("GSM8K, WeDLM-8B-Instruct, tau 0.2 / 0.9", 1.97, 3.2, "paper Fig. 5a: 92.3% / >79% accuracy"),
    ("code", 2.0, 3.0, "README: 2-3x"),
    ("open-ended QA", 1.5, 2.0, "README: 1.5-2x"),
)


def _median(value) -> float:
    return value.median if isinstance(value, Spread) else value


@dataclass(frozen=True)
class StepCosts:
    """A window step's time over an AR step's, by batch size: when one token commits per forward
    (``one``) and when all W do (``full``)."""

    window: int
    one: dict[int, float]
    full: dict[int, float]

    def ratio(self, batch: int, tokens: float) -> float:
        """Step over AR step at ``tokens`` per forward: linear between the two measured ends."""
        one, full = self.one[batch], self.full[batch]
        return one + (tokens - 1) / (self.window - 1) * (full - one)

    def speedup(self, batch: int, tokens: float) -> float:
        return tokens / self.ratio(batch, tokens)

    def tokens_for(self, batch: int, speedup: float) -> float | None:
        """The tokens per forward whose speed-up at ``batch`` is ``speedup``; None past W."""
        slope = (self.full[batch] - self.one[batch]) / (self.window - 1)
        if speedup * slope >= 1:
            return None
        tokens = speedup * (self.one[batch] - slope) / (1 - speedup * slope)
        return tokens if 1 <= tokens <= self.window else None


def _window_rows(records: list[dict]) -> tuple[int, dict[float, dict[int, dict]]]:
    """W and the merged window rows of step-cost runs by tokens per step, then batch size."""
    rows = [r for r in merge_runs(records) if r["mode"] != "ar"]
    windows = {r["window_size"] for r in rows}
    if len(windows) != 1:
        raise ValueError(f"step-cost runs of one window size expected, got {sorted(windows)}")
    by_tokens: dict[float, dict[int, dict]] = {}
    for row in rows:
        by_tokens.setdefault(_median(row["tokens_per_step"]), {})[row["batch_size"]] = row
    return windows.pop(), by_tokens


def step_costs(records: list[dict]) -> StepCosts:
    """The median over step-cost runs of the one-token and the fill-all window step, per batch."""
    window, rows = _window_rows(records)
    one, full = rows.get(1.0, {}), rows.get(float(window), {})
    return StepCosts(window, {b: _median(r["step_vs_ar"]) for b, r in one.items()},
                     {b: _median(r["step_vs_ar"]) for b, r in full.items()})


def expectation(records: list[dict], paths: list[str]) -> str:
    """WeDLM-8B's published speed-ups per task, the tokens per forward they imply on this engine and
    the speed-ups those give at each larger batch measured (derived), with the measured ends."""
    costs = step_costs(records)
    measured = _window_rows(records)[1]
    batches = sorted(b for b in costs.one if b in costs.full)
    first, later = batches[0], batches[1:]
    header = ["task (published speed-up over AR, where)", "tokens/forward", f"batch {first}",
              *(f"batch {b}" for b in later)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task, low, high, where in PUBLISHED:
        tokens = [costs.tokens_for(first, s) for s in (low, high)]
        cells = [f"{task} ({where})", _range(tokens, dagger=True), _range([low, high]) + "x published"]
        cells += [_range([t and costs.speedup(b, t) for t in tokens], dagger=True, unit="x") for b in later]
        lines.append("| " + " | ".join(cells) + " |")
    for label, tokens in (("this engine, every mask fills (measured)", float(costs.window)),
                          ("this engine, one token per forward (measured)", 1.0)):
        speedups = [_number(_median(measured[tokens][b]["speedup_vs_ar"])) + "x" for b in batches]
        lines.append("| " + " | ".join([label, _number(tokens), *speedups]) + " |")
    ends = "; ".join(f"batch {b}: {costs.one[b]:.2f}x to {costs.full[b]:.2f}x" for b in batches)
    notes = [f"† Derived, not measured. A window step's time over an AR step is taken as linear in the tokens t "
             f"a forward commits, between the one-token step (t = 1) and the fill-all step (t = W = {costs.window}) "
             f"measured on the Qwen3-8B shape (median of {len(records)} runs: {ends}). The published speed-up s is "
             f"taken to be at batch {first}, so t solves s = t / ratio(batch {first}, t), and the speed-up expected "
             "at batch b is t / ratio(b, t). This assumes WeDLM's own engine paid what this one pays per step; "
             "its batch size and GPU are not published.",
             _commands(records), _files(paths)]
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def _range(values: list[float | None], dagger: bool = False, unit: str = "") -> str:
    if any(v is None for v in values):
        return "past W"
    low, high = _number(min(values)), _number(max(values))
    text = low if low == high else f"{low}-{high}"
    return text + unit + ("†" if dagger else "")


# ---- pages with marked blocks -------------------------------------------------------------------

BLOCK = re.compile(r"(?P<begin><!-- report:begin (?P<name>[\w.-]+): (?P<args>[^\n]*?) -->\n)(?P<body>.*?)"
                   r"(?P<end><!-- report:end (?P=name) -->)", re.S)


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(name, report arguments, body) of every marked block of a page."""
    return [(m["name"], m["args"], m["body"]) for m in BLOCK.finditer(text)]


def block_body(args: str, base: Path) -> str:
    """What a marked block with these arguments holds: the report, a blank line either side."""
    return "\n" + render(parse(shlex.split(args)), base) + "\n\n"


def refresh(text: str, base: Path) -> str:
    return BLOCK.sub(lambda m: m["begin"] + block_body(m["args"], base) + m["end"], text)


def _page(page: Path, write_back: bool) -> None:
    text = page.read_text()
    stale = [name for name, args, body in blocks(text) if body != block_body(args, page.parent)]
    if write_back:
        page.write_text(refresh(text, page.parent))
        print(f"{page}: {len(blocks(text))} blocks, {len(stale)} re-rendered")
    elif stale:
        raise SystemExit(f"{page}: stale blocks (python -m benchmarks report --update {page}): {', '.join(stale)}")
