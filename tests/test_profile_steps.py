"""benchmarks.profile_steps runs end to end on the real engine (CPU here), on a model shape with
random weights (``--shape``), as the H100 profiles of BENCHMARKS.md 5.10 ran it. What is asserted
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


@pytest.mark.parametrize("decoding", ["ar", "wedlm"])
def test_profile_of_a_shape_counts_its_steps(decoding):
    fill_all = ["--tau", "1e9", "--window-size", str(W)] if decoding == "wedlm" else []
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile_steps", "--shape", "tiny", "--decoding", decoding,
                           *fill_all, "--batch-size", str(BATCH), "--max-tokens", str(MAX_TOKENS),
                           "--max-model-len", "256", "--top", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    found = re.search(rf"^{decoding}: (\d+) tokens in (\d+) steps", done.stdout, re.MULTILINE)
    assert found, done.stdout[-2000:]
    tokens, steps = map(int, found.groups())
    assert tokens == BATCH * MAX_TOKENS
    assert steps == (MAX_TOKENS if decoding == "ar" else MAX_TOKENS // W)
    assert "function calls" in done.stdout  # the host's profile follows
