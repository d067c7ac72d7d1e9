"""The main job as scripts/demo.sh runs it (examples/generate.py --log-file): quiet, right, with the ratio.

The demo decodes the shipped micro model's five default word problems in both modes on the real
engine. The terminal gets progress lines and the table only; vLLM's log lines (its own and its
engine processes') go to the log file; every default prompt is answered right in both modes; the
WeDLM / AR ratio is measured as it runs (its value is a speed, so it is only checked to be there).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_prints_only_its_table_and_answers_every_default_prompt_right(tmp_path):
    log = tmp_path / "logs" / "demo.log"
    run = subprocess.run([sys.executable, "examples/generate.py", "--log-file", str(log)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + log.read_text()[-3000:] if log.exists() else ""
    assert run.stderr == ""
    lines = run.stdout.splitlines()
    # Nothing of vLLM's: no log records, no engine-process prefixes, no progress bars.
    assert not [line for line in lines if re.search(r"\b(INFO|WARNING|DEBUG)\b|^\(\w+ pid=|it/s\]", line)]
    assert [line for line in lines if line.startswith("... ")], "a progress line while the engines work"
    answers = [line.split() for line in lines if line.startswith(("  AR ", "  WeDLM "))]
    assert [(words[0], words[1]) for words in answers] == [("AR", "right"), ("WeDLM", "right")] * 5
    assert re.search(r"^AR +5/5 ", run.stdout, re.M) and re.search(r"^WeDLM +5/5 ", run.stdout, re.M)
    assert re.search(r"^WeDLM / AR: \d+\.\d\dx the tokens per second", run.stdout, re.M)
    assert f"the engines' log: {log}" in run.stdout
    # The log holds what the terminal did not: both engines' start-up, from the engine processes too.
    text = log.read_text()
    assert text.count("Initializing a V1 LLM engine") == 2 and "EngineCore" in text
