"""Real code as training chats: functions of the running Python's standard library, with their source
as the answer.

    python -m vllm_wedlm.training.data.source_code OUT.jsonl --chats 4000

Self-distillation teaches a model its own answers; these chats add code nobody here wrote (the
Python Software Foundation's, PSF license) for the prediction stream to fill. Each chat asks for one
public function or method of a public standard-library module by its qualified name and signature,
and the answer is its source as written there, in a Python code block (docstring and comments
included, indentation of a method removed; a method that does not parse on its own is left out).
Functions of 3 to 40 lines only: long enough to hold structure, short enough to fit a training chat.
The user turn decides the split (``tasks.split_of``), as for every other data source, so held-out
prompts never reach the training data; none of HumanEval's problems are standard-library functions.
Same Python, same chats.
"""

from __future__ import annotations

import argparse
import ast
import random
import sys
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from vllm_wedlm.training.data.chat_data import chat_record, write_chats
from vllm_wedlm.training.data.stdlib import stdlib_modules
from vllm_wedlm.training.data.tasks import SPLITS, split_of

KIND = "source"
MIN_LINES, MAX_LINES = 3, 40
_ASKS = (
    "Write the Python standard library function `{name}{signature}` from the `{module}` module.",
    "Show the source of `{name}{signature}` in Python's `{module}` module.",
    "Implement `{name}{signature}` as Python's `{module}` module does.",
)


@dataclass(frozen=True)
class Function:
    module: str  # e.g. "json.decoder"
    name: str  # qualified within the module, e.g. "JSONDecoder.decode"
    signature: str  # "(self, s, _w=WHITESPACE.match)"
    source: str  # dedented
    origin: str  # "json/decoder.py:332"


@lru_cache(maxsize=1)
def stdlib_functions() -> tuple[Function, ...]:
    """Every public function and method of 3 to 40 lines in the public standard-library modules, in a
    fixed order (file, then position)."""
    found = []
    for module in stdlib_modules():
        lines = module.text.splitlines()
        for node, name in _public_functions(module.tree):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if not MIN_LINES <= node.end_lineno - first + 1 <= MAX_LINES:
                continue
            source = textwrap.dedent("\n".join(lines[first - 1: node.end_lineno]))
            if not _parses(source):
                continue  # a multi-line string flush left in a method: the source does not stand alone
            signature = "(" + ast.unparse(node.args) + ")"
            found.append(Function(module.name, name, signature, source, f"{module.path}:{first}"))
    return tuple(found)


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def _public_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node, node.name
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                    yield member, f"{node.name}.{member.name}"


def source_chats(split: str, count: int, seed: int = 0) -> list[dict]:
    """``count`` chat records (fewer if the split has fewer functions) asking for a function's source."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    functions = list(stdlib_functions())
    random.Random(f"{seed}/source").shuffle(functions)
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    records = []
    for function in functions:
        # The wording depends on the function alone, so each function has one prompt and one split.
        ask = random.Random(f"{seed}/source/{function.origin}").choice(_ASKS)
        prompt = ask.format(name=function.name, signature=function.signature, module=function.module)
        if split_of(prompt) != split:
            continue
        provenance = {"source": f"{python} standard library, {function.origin}", "license": "PSF-2.0",
                      "split": split}
        records.append(chat_record(KIND, prompt, f"```python\n{function.source}\n```", provenance))
        if len(records) == count:
            break
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Chats whose answers are standard-library functions' source.")
    parser.add_argument("out", help="chat data file to write (JSON lines; replaced if it exists)")
    parser.add_argument("--chats", type=int, default=4000)
    parser.add_argument("--split", default="train", choices=SPLITS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.write_text("")
    written = write_chats(out, source_chats(args.split, args.chats, args.seed))
    print(f"{written} chats from {len(stdlib_functions())} standard-library functions -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
