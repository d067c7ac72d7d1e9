"""Markdown tables and plots of benchmark result files (``python -m benchmarks report``)."""

from __future__ import annotations

from pathlib import Path

COLUMNS = {
    "offline": [("mode", "mode"), ("kind", "task"), ("batch_size", "batch"), ("shots", "shots"),
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


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
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
    load = "batch_size" if record["benchmark"] == "offline" else "concurrency"
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
