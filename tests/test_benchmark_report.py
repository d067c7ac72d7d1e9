"""BENCHMARKS.md and benchmarks/results/ against each other, and the report's medians (no engine, seconds).

* every table between ``<!-- report:begin NAME: ARGS -->`` and ``<!-- report:end NAME -->`` is what
  ``python -m benchmarks report ARGS`` renders from today's files, so the page cannot drift from the data;
* the index ``benchmarks/results/README.md`` lists every result file outside ``superseded/``, and
  every file it lists exists;
* the median and spread of repeated runs, and the derived "what to expect" arithmetic, on small
  synthetic records.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.report import Spread, StepCosts

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
#: The page's headline tables; dropping one from the page fails the test.
HEADLINES = {"step-cost-8b", "offline-small", "online-small", "multi-gpu", "smollm2", "expect", "where-w-goes",
             "step-cost-8b-auto"}


# ---- the page against the files -----------------------------------------------------------------

def test_report_blocks_of_benchmarks_md_are_what_their_files_render():
    blocks = report.blocks(PAGE.read_text())
    names = [name for name, _, _ in blocks]
    assert len(names) == len(set(names)), f"block names repeat: {names}"
    assert HEADLINES <= set(names), f"missing blocks: {HEADLINES - set(names)}"
    for name, args, body in blocks:
        assert body == report.block_body(args, ROOT), (
            f"BENCHMARKS.md block {name!r} differs from its files: python -m benchmarks report --update BENCHMARKS.md")


def test_report_blocks_render_only_current_files():
    for name, args, _ in report.blocks(PAGE.read_text()):
        paths = report.parse(args.split()).results
        assert paths, name
        for path in paths:
            assert (ROOT / path).is_file() and "superseded" not in path, f"{name}: {path}"


def test_report_check_finds_an_edited_number(tmp_path):
    """``--check`` (and the comparison above) notice a table whose numbers were typed over."""
    text = PAGE.read_text()
    name, args, body = next(b for b in report.blocks(text) if b[0] == "step-cost-8b")
    edited = body.replace("| 6.77 [", "| 6.70 [", 1)
    assert edited != body
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(text.replace(body, edited))
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    with pytest.raises(SystemExit, match=name):
        report.main(report.parse(["--check", str(page)]))
    report.main(report.parse(["--update", str(page)]))
    assert page.read_text() == text


# ---- the index against the folder ---------------------------------------------------------------

def indexed() -> set[str]:
    """The files the index links to, relative to benchmarks/results/ (folders left out)."""
    targets = re.findall(r"\]\(([^)#]+)\)", INDEX.read_text())
    return {t for t in targets if not t.startswith(("..", "http")) and not t.endswith("/")}


def stored() -> set[str]:
    return {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*")
            if p.is_file() and p.parts[len(RESULTS.parts)] != "superseded" and p != INDEX}


def test_index_lists_every_current_result_file():
    missing = stored() - indexed()
    assert not missing, f"benchmarks/results/README.md does not list: {sorted(missing)}"


def test_index_lists_only_files_that_exist():
    absent = {t for t in indexed() if not (RESULTS / t).is_file()}
    assert not absent, f"benchmarks/results/README.md lists files that are not there: {sorted(absent)}"


def test_index_gives_one_line_and_a_command_per_file():
    for line in INDEX.read_text().splitlines():
        if line.startswith("- [`") and "](superseded" not in line:
            assert "Made by `" in line, line


# ---- the medians of repeated runs, on synthetic records -----------------------------------------

def run(ar_ms: float, wedlm_ms: float, ar_tok_s: float, wedlm_tok_s: float) -> dict:
    """A step-cost-like and offline-like record with one AR and one WeDLM point."""
    return {"benchmark": "offline", "command": "python -m benchmarks offline --json /tmp/x.json",
            "environment": {"device": "GPU", "vllm": "0.26.0", "torch": "2"},
            "rows": [{"mode": "ar", "kind": "arithmetic", "batch_size": 1, "requests": 16, "shots": 0,
                      "max_tokens": 256, "output_tok_s": ar_tok_s, "speedup_vs_ar": 1.0, "step_ms": ar_ms},
                     {"mode": "wedlm:0.4", "kind": "arithmetic", "batch_size": 1, "requests": 16, "shots": 0,
                      "max_tokens": 256, "output_tok_s": wedlm_tok_s, "speedup_vs_ar": round(wedlm_tok_s / ar_tok_s, 3),
                      "step_ms": wedlm_ms, "scheduling": "sync"}]}


def test_report_median_and_spread_of_three_runs():
    rows = report.merge_runs([run(7.0, 8.0, 100.0, 600.0), run(6.0, 9.0, 120.0, 480.0), run(8.0, 7.5, 110.0, 660.0)])
    ar, wedlm = rows
    assert ar["step_ms"] == Spread(7.0, 6.0, 8.0)
    assert wedlm["step_ms"] == Spread(8.0, 7.5, 9.0)
    assert wedlm["output_tok_s"] == Spread(600.0, 480.0, 660.0)
    assert wedlm["speedup_vs_ar"] == Spread(6.0, 4.0, 6.0)  # the median of each run's ratio, not a ratio of medians
    assert (wedlm["mode"], wedlm["requests"], wedlm["scheduling"]) == ("wedlm:0.4", 16, "sync")  # settings as they are
    assert report.spread([3.0, 1.0, 2.0, 10.0]) == Spread(2.5, 1.0, 10.0)  # an even count: the mean of the middle two


def test_report_one_run_shows_its_timed_repeats():
    record = run(7.0, 8.0, 100.0, 600.0)
    record["rows"][1].update(output_tokens=60, seconds=0.1, seconds_spread=[0.08, 0.125], step_ms_spread=[7.9, 8.2])
    wedlm = report.merge_runs([record])[1]
    assert wedlm["output_tok_s"] == Spread(600.0, 480.0, 750.0)
    assert wedlm["step_ms"] == Spread(8.0, 7.9, 8.2)
    assert wedlm["speedup_vs_ar"] == 6.0  # one run: a plain number


def test_report_refuses_runs_of_different_points():
    other = run(7.0, 8.0, 100.0, 600.0)
    other["rows"][1]["batch_size"] = 64
    with pytest.raises(ValueError, match="different points"):
        report.merge_runs([run(7.0, 8.0, 100.0, 600.0), other])


def test_report_median_table_cells_and_notes():
    text = report.summary([run(7.0, 8.0, 100.0, 600.0), run(6.0, 9.0, 120.0, 480.0), run(8.0, 7.5, 110.0, 660.0)],
                          ["a.json", "b.json", "c.json"])
    assert "| wedlm:0.4 | 600 [480-660] | 6 [4-6] |" in text
    assert "| ar | 110 [100-120] | 1 |" in text
    assert "Median of 3 runs" in text and "Every row: task arithmetic, batch 1, requests 16" in text
    assert "Command: `python -m benchmarks offline`." in text  # the scratch path left out
    assert "[`c.json`](c.json)" in text


def test_report_versus_and_where_w_goes_across_files_of_different_kinds():
    """``--versus``: one row per point of files that measured different kinds, each mode's tok/s over
    its run's AR; ``--windows``: the share of an adaptive mode's windows at each class of W."""
    first = run(7.0, 8.0, 100.0, 600.0)
    first["rows"][0].update(output_tokens=100, seconds_spread=[0.8, 1.25], repeats=3, accuracy=1.0)
    first["rows"][1].update(tokens_per_forward=12.5, accuracy=0.5, window_histogram={"16": 3, "0": 1})
    second = run(7.0, 8.0, 200.0, 100.0)
    for row in second["rows"]:
        row["kind"] = "prose"
    second["rows"][1]["window_histogram"] = {"0": 199, "1": 1}
    text = report.versus([first, second], ["a.json", "b.json"])
    assert "| task | batch | AR tok/s | wedlm:0.4 vs AR (TPF) | accuracy: ar / wedlm:0.4 |" in text
    assert "| arithmetic | 1 | 100 [80-125] | 6x (12.5) | 1 / 0.5 |" in text
    assert "| prose | 1 | 200 | 0.5x () |  |" in text
    shares = report.window_shares([first, second], ["a.json", "b.json"])
    assert "| arithmetic | 1 | wedlm:0.4 | 4 | 25% |  |  |  |  |  | 75% |" in shares
    assert "| prose | 1 | wedlm:0.4 | 200 | 100% | <1% |" in shares
    with pytest.raises(ValueError, match="ar at arithmetic, 1 is in two files"):
        report.versus([first, first], ["a.json", "a.json"])


def test_report_expectation_arithmetic():
    costs = StepCosts(window=16, one={1: 1.1, 64: 3.5}, full={1: 1.1, 64: 5.0})
    assert costs.ratio(64, 1.0) == pytest.approx(3.5) and costs.ratio(64, 16.0) == pytest.approx(5.0)
    assert costs.ratio(64, 8.5) == pytest.approx(4.25)
    assert costs.tokens_for(1, 5.0) == pytest.approx(5.5)  # a flat batch-1 cost: t = s x 1.1
    for speedup in (1.5, 3.0, 10.0):  # the inverse of speedup() wherever the cost slopes
        tokens = costs.tokens_for(64, speedup)
        assert tokens is None or costs.speedup(64, tokens) == pytest.approx(speedup)
    assert costs.tokens_for(1, 20.0) is None  # past W tokens per forward
