"""The running Python's public standard-library modules, parsed: the text nobody here wrote that two
data sources read (prompts.py its docstrings, source_code.py its functions)."""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Packages left out: tests, tools and data rather than library code.
_SKIPPED = {"test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "tkinter", "encodings"}


@dataclass(frozen=True)
class Module:
    name: str  # e.g. "json.decoder"
    path: Path  # relative to the standard library's folder, e.g. json/decoder.py
    text: str
    tree: ast.Module


def stdlib_modules() -> Iterator[Module]:
    """The standard library's top-level modules and those of its packages one level down (private
    ones, named ``_x``, and the skipped packages left out), in a fixed order; files that do not
    parse are skipped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(root.glob("*.py")) + sorted(p for p in root.glob("*/*.py") if p.parent.name not in _SKIPPED)
    for path in paths:
        if path.stem.startswith("_") and path.stem != "__init__":
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        parts = path.relative_to(root).with_suffix("").parts
        yield Module(".".join(parts[:-1] if parts[-1] == "__init__" else parts), path.relative_to(root), text, tree)
