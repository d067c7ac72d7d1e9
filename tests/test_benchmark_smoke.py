"""The benchmark harness runs end to end on tiny checkpoints (CI proves it works; no timing asserted).

What is asserted are the counts a run must get exactly right: tokens produced, and tokens per
forward where the algorithm fixes it (AR: 1; WeDLM filling every mask with ignore_eos: a window of
W commits W tokens each forward after the first, so max_tokens / (max_tokens / W + 1)) or bounds it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import build_checkpoint
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.engine_settings import on_gpu

ROOT = Path(__file__).resolve().parents[1]
W, MAX_TOKENS = 4, 16
# Fill-all windows fill W slots per forward, returned as soon as filled: MAX_TOKENS / W forwards.
FILL_ALL_TPF = MAX_TOKENS / (MAX_TOKENS / W)


def bench(*args: str) -> dict:
    out = Path(args[args.index("--json") + 1]) if "--json" in args else None
    done = subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "[1/" in done.stderr  # progress lines while it runs
    return json.loads(out.read_text()) if out else {}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("bench"), TinySpec(variant="qwen3", logit_scale=30.0))


def check_counts(rows: list[dict], batch_key: str) -> None:
    for row in rows:
        assert row["output_tokens"] == row["requests"] * MAX_TOKENS
        if row["mode"] == "ar":
            assert row["tokens_per_forward"] == 1.0 and row["speedup_vs_ar"] == 1.0
        elif row["mode"] == "wedlm-ar":  # AR requests on the WeDLM engine: one token per forward
            assert row["tokens_per_forward"] == 1.0
        elif row["mode"] == "wedlm:inf":
            assert row["tokens_per_forward"] == pytest.approx(FILL_ALL_TPF)
        elif row["mode"].startswith("lossless"):
            assert row["tokens_per_forward"] >= 1.0  # every window forward commits its verified slot 0
        else:
            # n-gram: one token per forward plus accepted drafts. WeDLM at 0.4: every forward fills
            # at least one slot, and every filled slot is committed except those still in the
            # window (at most 2W) when max_tokens ends the request: the window keeps W undecided
            # slots to the end, whatever max_tokens is. So forwards <= 1 + MAX_TOKENS + 2W.
            least = 1.0 if row["mode"].startswith("ngram") else MAX_TOKENS / (MAX_TOKENS + 2 * W + 1)
            assert row["tokens_per_forward"] >= round(least, 3)  # the harness reports 3 decimals
        assert row["speedup_vs_ar"] > 0 and row[batch_key] >= 1


def common_args(model) -> list[str]:
    return ["--model", str(model), "--kinds", "counting,arithmetic", "--requests", "2", "--max-tokens", str(MAX_TOKENS),
            "--ignore-eos", "--window-size", str(W), "--max-model-len", "512"]


def check_report(results: list[Path], out: Path, sections: int, images: tuple[str, ...]) -> None:
    """``benchmarks report`` of ``results`` writes one table per file, a row for every mode they hold
    and every plot it names."""
    done = subprocess.run([sys.executable, "-m", "benchmarks", "report", *map(str, results), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    text = (out / "report.md").read_text()
    assert text.count("| mode |") == sections
    for result in results:
        for row in json.loads(result.read_text())["rows"]:
            assert f"| {row['mode']} |" in text
    for image in images:
        assert (out / image).stat().st_size > 1000 and image in text


# The harness's three benchmarks are separate tests, so that a GPU suite (scripts/gpu_suite.py) can
# run them side by side: each starts several engines or servers, one after another.

def test_offline_harness(model, tmp_path):
    offline = bench("offline", *common_args(model), "--modes", "ar,ngram,wedlm:0.4,wedlm:inf,lossless:inf,wedlm-ar",
                    "--batch-sizes", "1,2", "--json", str(tmp_path / "offline.json"))
    assert len(offline["rows"]) == 6 * 2 * 2
    check_counts(offline["rows"], "batch_size")
    assert {r["accuracy"] is not None for r in offline["rows"]} == {True}  # both kinds are scored
    for row in offline["rows"]:  # every repeat's, the last one's the row's
        assert len(row["accuracy_repeats"]) == row["repeats"] and row["accuracy_repeats"][-1] == row["accuracy"]
        if row["mode"] in ("ar", "lossless:inf", "wedlm-ar"):  # AR's output: the same answers each repeat
            assert len(set(row["accuracy_repeats"])) == 1, row
    # Each WeDLM row counts its steps of plain windows: compiled where the engine compiles (a GPU
    # without --enforce-eager), else eager.
    ran, never = ("compiled", "eager") if on_gpu() else ("eager", "compiled")
    for row in offline["rows"]:
        if row["mode"].startswith("wedlm:"):
            assert row["window_steps"][ran] > 0 and row["window_steps"][never] == 0, row
    ar = {(r["kind"], r["batch_size"]): r["accuracy"] for r in offline["rows"] if r["mode"] == "ar"}
    for row in offline["rows"]:
        if row["mode"] in ("lossless:inf", "wedlm-ar"):  # AR's output, so AR's accuracy
            assert row["accuracy"] == ar[row["kind"], row["batch_size"]]

    # Every engine up at once, repeats alternating between modes: the same counts and outputs.
    interleaved = bench("offline", *common_args(model), "--modes", "ar,wedlm:inf", "--batch-sizes", "1",
                        "--kinds", "arithmetic", "--repeats", "2", "--interleave",
                        "--json", str(tmp_path / "interleaved.json"))
    keys = ("mode", "kind", "batch_size", "output_tokens", "tokens_per_forward", "accuracy")
    assert sorted(tuple(r[k] for k in keys) for r in interleaved["rows"]) == sorted(
        tuple(r[k] for k in keys) for r in offline["rows"]
        if r["mode"] in ("ar", "wedlm:inf") and r["kind"] == "arithmetic" and r["batch_size"] == 1)
    assert {r["repeats"] for r in interleaved["rows"]} == {2}
    check_report([tmp_path / "offline.json"], tmp_path / "report", 1,
                 ("0-offline-speedup.png", "0-offline-speed-vs-accuracy.png"))

    # The adaptive window (+auto; with --window-tokens, W at most --window-size): each row says so and
    # counts the windows its last repeat planned at each W (0: an AR step of the batch).
    adaptive = bench("offline", *common_args(model), "--modes", "wedlm:0.4+auto,lossless:0.4+auto",
                     "--window-tokens", "64", "--batch-sizes", "2", "--kinds", "arithmetic",
                     "--json", str(tmp_path / "adaptive.json"))
    for row in adaptive["rows"]:
        assert row["adaptive_window"] and row["window_tokens"] == 64, row
        sizes = {int(w): n for w, n in row["window_histogram"].items()}
        assert sizes and set(sizes) <= set(range(W + 1)) and sum(sizes.values()) >= row["requests"], row


def test_online_harness(model, tmp_path):
    online = bench("online", *common_args(model), "--modes", "ar,wedlm:inf,wedlm-ar", "--concurrency", "1,2",
                   "--json", str(tmp_path / "online.json"))
    assert len(online["rows"]) == 3 * 2 * 2
    check_counts(online["rows"], "concurrency")
    for row in online["rows"]:
        assert 0 < row["ttft_s_p50"] <= row["latency_s_p50"] and row["request_tok_s_p50"] > 0
        # Each WeDLM row says how its server scheduled: synchronously with exact rows, the default on
        # a CPU and, for a model this small, on a GPU.
        if row["mode"].startswith("wedlm:"):
            assert (row["scheduling"], row["window_rows"]) == ("sync", "exact"), row
        else:
            assert row["mode"] == "wedlm-ar" or "scheduling" not in row, row
    # Both servers up at once, the modes back to back at each point: the same counts and outputs.
    interleaved = bench("online", *common_args(model), "--modes", "ar,wedlm:inf", "--concurrency", "2",
                        "--kinds", "arithmetic", "--interleave", "--json", str(tmp_path / "online-interleaved.json"))
    keys = ("mode", "kind", "concurrency", "output_tokens", "tokens_per_forward", "accuracy")
    assert sorted(tuple(r[k] for k in keys) for r in interleaved["rows"]) == sorted(
        tuple(r[k] for k in keys) for r in online["rows"]
        if r["mode"] != "wedlm-ar" and r["kind"] == "arithmetic" and r["concurrency"] == 2)
    check_report([tmp_path / "online.json"], tmp_path / "report", 1, ("0-online-speedup.png",))


def test_step_cost_harness(tmp_path):
    step = bench("step-cost", "--shape", "tiny", "--windows", f"{W},auto", "--batch-sizes", "1,2", "--taus", "inf",
                 "--prompt-tokens", "16", "--lengths", "8,24", "--workdir", str(tmp_path / "shape"),
                 "--request-ar", "--json", str(tmp_path / "step.json"))
    fixed = [r for r in step["rows"] if r["window_size"] != "auto" and r["mode"] != "wedlm-ar"]
    assert [(r["mode"], r["batch_size"], r["tokens_per_step"]) for r in fixed] == [
        ("ar", 1, 1.0), ("ar", 2, 1.0), ("wedlm:inf", 1, float(W)), ("wedlm:inf", 2, float(W))]
    # The adaptive window: every mask fills, so its windows grow to the most (16) and commit more.
    adaptive = [r for r in step["rows"] if r["window_size"] == "auto"]
    assert [r["batch_size"] for r in adaptive] == [1, 2]
    for row in adaptive:
        assert "16" in row["window_histogram"] and row["tokens_per_step"] > W, row
    # --request-ar: the WeDLM engine decodes every request AR, a step per token at least (8 + 24
    # per timed pair) and none of them a window step.
    request_ar = [r for r in step["rows"] if r["mode"] == "wedlm-ar"]
    assert [(r["batch_size"], r["tokens_per_step"]) for r in request_ar] == [(1, 1.0), (2, 1.0)]
    for row in request_ar:
        assert sum(row["graph_modes"].values()) >= 8 + 24 and sum(row["window_steps"].values()) == 0, row
    check_report([tmp_path / "step.json"], tmp_path / "report", 1, ("0-step-cost-step-cost.png",))


def test_report_of_recorded_results(tmp_path):
    """The report still reads the result files recorded on a GPU (three benchmarks in one report)."""
    recorded = ROOT / "benchmarks" / "results" / "h200"
    check_report([recorded / "offline-small.json", recorded / "online-small.json", recorded / "step-cost-8b.json"],
                 tmp_path / "report", 3, ("0-offline-speedup.png", "0-offline-speed-vs-accuracy.png",
                                          "1-online-speedup.png", "2-step-cost-step-cost.png"))
