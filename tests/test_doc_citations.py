"""Every citation of BENCHMARKS.md and of the lab notebook resolves (issue 69; no engine, a second).

BENCHMARKS.md holds current results only: what it held before lives in the lab notebook
(docs/lab-notebook.md, 5.37 for its old 7.1-7.8 and 8.1). A citation that outlives its section
misleads, so across the repository's Markdown, Python and shell files this checks that

* every relative Markdown link names a file or folder that exists, and its ``#anchor``, where the
  target is a Markdown page of the repository, is the GitHub anchor of one of that page's headings
  (``BENCHMARKS.md#7-...``, ``lab-notebook.md#5373-...``, a page's own ``#...``);
* every textual ``BENCHMARKS N`` / ``BENCHMARKS.md N.M`` / ``BENCHMARKS.md, section N`` (with any
  ``, N.M`` or ``-N.M`` after it) names a numbered heading of BENCHMARKS.md, and every
  ``BENCHMARKS "Title"`` the start of one of its titles;
* every ``notebook N.M`` / ``lab notebook N.M`` names a numbered heading of the notebook.

A citation right after "was" or "from" names a former place ("lab notebook 5.37.3, was BENCHMARKS
7.3") and is left alone. Result files under ``benchmarks/results/`` other than its index are data.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "BENCHMARKS.md"
NOTEBOOK = ROOT / "docs" / "lab-notebook.md"
SUFFIXES = {".md", ".py", ".sh", ".html", ".toml"}
SKIPPED = {"__pycache__", "build", "dist", "node_modules"}

NUMBER = r"(\d+(?:\.\d+)*)"
MORE = r"((?:\s*(?:,|and|-|to)\s*\d+\.\d+(?:\.\d+)*)*)"  # ", 7.8", "-7.8", " and 5.37.9" after the first
#: "BENCHMARKS 7.3", "BENCHMARKS.md, section 5", across a line break and a comment's "#" or "#:" too.
PAGE_CITATION = re.compile(r"(?<![\w/-])BENCHMARKS(?:\.md)?,?(?:[ \t]+|[ \t]*\n[ \t]*(?:#:?|\*|//)?[ \t]*)"
                           r"(?:sections?[ \t]+)?" + NUMBER + MORE)
PAGE_TITLE = re.compile(r"(?<![\w/-])BENCHMARKS(?:\.md)?,?\s+\"([^\"\n]+)\"")
NOTEBOOK_CITATION = re.compile(r"(?<![\w-])notebook(?:'s)?\s+(?:sections?\s+)?" + NUMBER + MORE)
LINK = re.compile(r"\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """A Markdown page's headings, fenced code left out."""
    return [line.lstrip("#").strip() for line in FENCE.sub("", path.read_text()).splitlines()
            if re.match(r"#{1,6} ", line)]


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (``-1``, ``-2``)."""
    found, counts = set(), {}
    for title in headings(path):
        slug = anchor(title)
        found.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
        counts[slug] = counts.get(slug, 0) + 1
    return found


def numbered(path: Path) -> set[str]:
    """The section numbers of a page's headings: "7" of "7. The adaptive window", "5.37.3"."""
    return {m.group(1) for title in headings(path) if (m := re.match(r"(\d+(?:\.\d+)*)\.?\s", title))}


def files() -> list[Path]:
    """The repository's text files that may cite: docs, code, tests, scripts; not hidden folders, not
    data, not this file (its examples are stale on purpose)."""
    results = ROOT / "benchmarks" / "results"
    out = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = sorted(d for d in subfolders
                               if not d.startswith(".") and d not in SKIPPED and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(folder) / name
            data = path.is_relative_to(results) and path != results / "README.md"
            if path.suffix in SUFFIXES and not data and path != Path(__file__).resolve():
                out.append(path)
    return out


def former(text: str, start: int) -> bool:
    """A citation right after "was" or "from": a former place, named on purpose."""
    return re.search(r"\b(?:was|from)\s+$", text[max(0, start - 8):start], re.I) is not None


def cited(match: re.Match) -> list[str]:
    return [match.group(1), *re.findall(r"\d+\.\d+(?:\.\d+)*", match.group(2))]


def stale_citations(text: str, page_numbers: set[str], page_titles: list[str], notebook_numbers: set[str]) -> list[str]:
    """The citations in text that name no section: ``BENCHMARKS N``, ``BENCHMARKS "Title"``, ``notebook N``."""
    stale = []
    for pattern, numbers in ((PAGE_CITATION, page_numbers), (NOTEBOOK_CITATION, notebook_numbers)):
        for match in pattern.finditer(text):
            if not former(text, match.start()) and any(n not in numbers for n in cited(match)):
                stale.append(" ".join(match.group(0).split()))
    for match in PAGE_TITLE.finditer(text):
        wanted = match.group(1).lower()
        if not former(text, match.start()) and not any(t.lower().startswith(wanted) for t in page_titles):
            stale.append(match.group(0))
    return stale


def page_titles(path: Path) -> list[str]:
    """Headings without their numbers: "What disappoints, and why", "The adaptive window, ..."."""
    return [re.sub(r"^\d+(?:\.\d+)*\.?\s+", "", title) for title in headings(path)]


# ---- the repository ----------------------------------------------------------------------------

def test_every_textual_citation_names_a_section_that_exists():
    page, notebook, titles = numbered(PAGE), numbered(NOTEBOOK), page_titles(PAGE)
    assert {"1", "6", "7", "8"} <= page and {"5.37", "5.37.3", "7.2"} <= notebook
    stale = {f"{path.relative_to(ROOT)}: {citation}" for path in files()
             for citation in stale_citations(path.read_text(errors="replace"), page, titles, notebook)}
    assert not stale, "citations of sections that do not exist (BENCHMARKS.md 7.1-7.8 and 8.1 are lab notebook " \
                      f"5.37.1-5.37.9; older 'BENCHMARKS 5.N' are lab notebook 5.N): {sorted(stale)}"


def test_every_markdown_link_and_anchor_resolves():
    cache: dict[Path, set[str]] = {}
    broken = []
    for path in files():
        if path.suffix != ".md":
            continue
        for match in LINK.finditer(FENCE.sub("", path.read_text())):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:
                continue
            name, _, fragment = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and linked.is_relative_to(ROOT):
                if fragment not in cache.setdefault(linked, anchors(linked)):
                    broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"links that lead nowhere: {broken}"


def test_anchors_in_code_and_text_resolve():
    """``BENCHMARKS.md#...`` or ``lab-notebook.md#...`` in code, tests and scripts (a docstring, a comment)."""
    targets = {"BENCHMARKS.md": anchors(PAGE), "lab-notebook.md": anchors(NOTEBOOK)}
    broken = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in files() if path.suffix != ".md"
              for m in re.finditer(r"(BENCHMARKS\.md|lab-notebook\.md)#([\w-]+)", path.read_text(errors="replace"))
              if m.group(2) not in targets[m.group(1)]]
    assert not broken, broken


# ---- the checks themselves, on synthetic text --------------------------------------------------

def test_stale_citations_are_found_and_former_places_are_not():
    page, notebook, titles = {"1", "7", "8"}, {"5.13", "5.37", "5.37.3"}, ["What disappoints, and why"]
    def stale(text):
        return stale_citations(text, page, titles, notebook)
    assert stale("as BENCHMARKS 7 says; BENCHMARKS.md, section 1; BENCHMARKS \"What disappoints\"") == []
    assert stale("lab notebook 5.37.3 (was BENCHMARKS 7.3), moved from BENCHMARKS.md 7.1-7.8") == []
    assert stale("timed in BENCHMARKS.md 7.3 (notebook 5.13)") == ["BENCHMARKS.md 7.3"]
    assert stale("(BENCHMARKS 7, 8.1)") == ["BENCHMARKS 7, 8.1"]  # a list: every number must exist
    assert stale("#: one H200, BENCHMARKS\n#: 5.10: the knee") == ["BENCHMARKS #: 5.10"]  # across a comment's lines
    assert stale("lab notebook 5.37.4; notebook 5.13-5.14") == ["notebook 5.37.4", "notebook 5.13-5.14"]
    assert stale("BENCHMARKS \"History\"") == ["BENCHMARKS \"History\""]


def test_anchors_as_github_makes_them():
    assert anchor("7. The adaptive window, the default: where W goes") == \
        "7-the-adaptive-window-the-default-where-w-goes"
    assert anchor("5.37.3 Whole-window probes; the 8B shape (session 44; was BENCHMARKS 7.3)") == \
        "5373-whole-window-probes-the-8b-shape-session-44-was-benchmarks-73"
    assert anchor("2. A trained model: `small` offline") == "2-a-trained-model-small-offline"
