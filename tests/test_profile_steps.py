"""benchmarks.profile_steps runs end to end on the real engine (CPU here), on a model shape with
random weights (``--shape``), as the H100 profiles of lab notebook 5.10 ran it. What is asserted
are the counts it reports, which the algorithm fixes: every answer runs to ``--max-tokens``; AR
takes one step per token; WeDLM filling every mask (tau above any entropy) takes one step per W
tokens, its first window riding with the prompt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
W, BATCH, MAX_TOKENS = 4, 2, 16


@pytest.mark.parametrize(("decoding", "layout"), [("ar", []), ("wedlm", []), ("wedlm", ["--fixed-rows"])],
                         ids=["ar", "wedlm", "wedlm-fixed-rows"])
def test_profile_of_a_shape_counts_its_steps(decoding, layout):
    fill_all = ["--tau", "1e9", "--window-size", str(W)] if decoding == "wedlm" else []
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile_steps", "--shape", "tiny", "--decoding", decoding,
                           *fill_all, *layout, "--batch-size", str(BATCH), "--max-tokens", str(MAX_TOKENS),
                           "--max-model-len", "256", "--top", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    found = re.search(rf"^{decoding}: (\d+) tokens in (\d+) steps", done.stdout, re.MULTILINE)
    assert found, done.stdout[-2000:]
    tokens, steps = map(int, found.groups())
    assert tokens == BATCH * MAX_TOKENS
    assert steps == (MAX_TOKENS if decoding == "ar" else MAX_TOKENS // W)
    assert "function calls" in done.stdout  # the host's profile follows


def test_cost_shape_gives_the_scheduler_that_shapes_curve(monkeypatch):
    """``--cost-shape qwen3-8b``: the adaptive window of a tiny model's engine chooses on the 8B
    shape's step-cost curve (its FLOPs per row), not the tiny model's."""
    from types import SimpleNamespace

    from benchmarks.profile_steps import _choose_on_cost_curve
    from vllm_wedlm.adapter import async_gate, scheduler

    monkeypatch.setattr(scheduler, "step_cost", scheduler.step_cost)  # put back after the test
    tiny = SimpleNamespace(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2)
    _choose_on_cost_curve("qwen3-8b")
    eight_b = SimpleNamespace(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                              num_key_value_heads=8)
    assert scheduler.step_cost(tiny) == async_gate.step_cost(eight_b) != async_gate.step_cost(tiny)


def test_kernels_are_sorted_by_kind_per_step():
    """The per-kind GPU times of ``--kernel-time``: FlashAttention 3's kernels are CUTLASS kernels
    but count as attention; cuBLAS's count as matrix products; the rest as other."""
    from types import SimpleNamespace

    from benchmarks.profile_steps import kernel_kinds

    names_and_us = [
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>", 3000.0),
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", 1000.0),
        ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", 8000.0),
        ("void cublasLt::splitKreduce_kernel<32, 16>", 2000.0),
        ("triton_poi_fused_mul_silu_slice_1", 500.0),
    ]
    kernels = [SimpleNamespace(key=name, self_device_time_total=us) for name, us in names_and_us]
    assert kernel_kinds(kernels, num_steps=2) == {"attention": 2.0, "matmul": 5.0, "other": 0.25}


def test_timeline_times_every_engine_step(tmp_path):
    """``--timeline``: every iteration of the engine-core loop of one more run is timed, in slices;
    on a CPU (synchronous) each iteration launches one forward and never waits for one in flight,
    and the phases add up to no more than the iteration's wall time."""
    import json

    out = tmp_path / "timeline.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile_steps", "--shape", "tiny", "--decoding", "wedlm",
                           "--tau", "1e9", "--window-size", str(W), "--fixed-rows", "--batch-size", str(BATCH),
                           "--max-tokens", str(MAX_TOKENS), "--max-model-len", "256", "--top", "3",
                           "--timeline", str(out), "--timeline-parts", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    timeline = json.loads(out.read_text())
    slices = timeline["slices"]
    assert len(slices) == 2 and sum(s["iterations"] for s in slices) == timeline["iterations"] == MAX_TOKENS // W
    for part in slices:
        assert part["forwards"] == part["iterations"] and part["wait_ms"] == 0.0, part
        inside = sum(part[f"{p}_ms"] for p in ("schedule", "execute", "sample", "wait", "update", "other"))
        assert part["other_ms"] >= 0 and part["between_ms"] >= 0
        assert inside + part["between_ms"] == pytest.approx(part["wall_ms_per_forward"], rel=0.02), part
