"""The AR-vs-WeDLM benchmark runs end to end on a tiny checkpoint (a smoke test: no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import build_checkpoint
from vllm_wedlm.checkpoints.tiny import TinySpec

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "offline_ar_vs_wedlm.py"


def test_offline_benchmark_runs_both_modes(tmp_path):
    model = build_checkpoint(tmp_path, TinySpec(variant="qwen3", logit_scale=30.0))
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--batch-size", "2",
                           "--max-tokens", "16", "--window-size", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(out.read_text())
    for mode in ("ar", "wedlm"):
        assert summary["results"][mode]["output_tokens"] == 2 * 16
    assert summary["wedlm_over_ar"] > 0
    assert "WeDLM decoding:" in done.stdout + done.stderr  # the engine's tokens-per-forward line
