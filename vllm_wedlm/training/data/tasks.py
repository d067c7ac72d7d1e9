"""Chat tasks generated offline, from low to high entropy, with a held-out split.

* ``counting``: counting up or down, even numbers, steps of k, the alphabet (nearly no entropy
  once the task is read: the case where parallel decoding should commit whole windows);
* ``arithmetic``: multi-step word problems answered with a short chain of thought ending in
  ``The answer is N.`` (verifiable, GSM8K-like);
* ``code``: complete a function from this Python's own standard library, given its signature
  and docstring;
* ``prose``: explain a standard-library module, class or function (its docstring's first paragraph).

Same seed, same tasks. A task belongs to the held-out ("test") split when a hash of its prompt
says so, so the splits never share a prompt whatever the counts asked for. Code and prose come
from the standard library of the running Python, so they differ between Python versions.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

KINDS = ("counting", "arithmetic", "code", "prose")
SPLITS = ("train", "test")
TEST_SHARE = 10  # one prompt in TEST_SHARE is held out
MAX_NUMBER = 150  # counting and arithmetic numbers stay about this small unless a recipe says otherwise

_NAMES = "Ada Ben Cleo Dev Eli Fay Gus Hana Ivo Jun Kai Lea Mo Nia Oto Pia".split()
_ITEMS = "apples pears stamps marbles books coins shells cards pens cups".split()
_GAINS = ("buys {n} more", "finds {n} more", "gets {n} from a friend", "receives {n} as a gift")
_LOSSES = ("gives away {n}", "sells {n}", "loses {n}", "uses {n}")
_SKIPPED_PACKAGES = {"test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "tkinter"}
_ANSWER = re.compile(r"The answer is (-?\d+)\.")
#: Every arithmetic response ``_arithmetic`` writes, as a regex (a structured-output constraint that a
#: model trained on these tasks follows: tests/test_grammar_windows.py, the harness's ``--structured``).
ARITHMETIC_RESPONSE = (r"[A-Z][a-z]+ starts with [0-9]+ [a-z]+\.\n"
                       r"([0-9]+ [-+] [0-9]+ = [0-9]+\.\n)+The answer is [0-9]+\.")


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str  # the user's message
    response: str  # the assistant's reference answer
    answer: str | None = None  # the verifiable final answer (arithmetic), else None
    finished: bool = True  # False: the response was cut by a length limit (it learns no end of turn)

    def messages(self, with_response: bool = True) -> list[dict[str, str]]:
        chat = [{"role": "user", "content": self.prompt}]
        if with_response:
            chat.append({"role": "assistant", "content": self.response})
        return chat


def chat_prompt(tokenizer: Any, task: Task) -> str:
    """The chat of ``task`` up to the assistant's answer, as the tokenizer's own chat template renders
    it (a transformers tokenizer): the text vLLM's chat endpoints give the model for this task."""
    return tokenizer.apply_chat_template(task.messages(with_response=False), add_generation_prompt=True, tokenize=False)


def split_of(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % TEST_SHARE == 0 else "train"


def final_answer(text: str) -> str | None:
    """The last ``The answer is N.`` in a text, or None."""
    found = _ANSWER.findall(text)
    return found[-1] if found else None


def _counting(rng: random.Random, top: int) -> Task:
    """A counting task whose numbers stay under ``top`` (150 by default)."""
    longest = max(4, min(30, top // 5))  # at most this many numbers to say
    style = rng.randrange(5)
    if style == 0:
        a = rng.randint(0, top - longest)
        b = a + rng.randint(4, longest)
        return Task("counting", f"Count from {a} to {b}.", ", ".join(map(str, range(a, b + 1))) + ".")
    if style == 1:
        a = rng.randint(longest, top)
        b = a - rng.randint(4, longest)
        return Task("counting", f"Count down from {a} to {b}.", ", ".join(map(str, range(a, b - 1, -1))) + ".")
    if style == 2:
        a = 2 * rng.randint(0, (top - 2 * longest) // 2)
        b = a + 2 * rng.randint(4, max(4, longest * 2 // 3))
        evens = ", ".join(map(str, range(a, b + 1, 2))) + "."
        return Task("counting", f"List the even numbers from {a} to {b}.", evens)
    if style == 3:
        k = rng.randint(3, max(3, min(10, top // 15)))
        n = rng.randint(4, max(4, min(15, top // (2 * k))))
        a = rng.randint(0, max(0, min(50, top - k * n)))
        values = [a + k * i for i in range(n)]
        return Task("counting", f"Count from {a} in steps of {k}, {n} numbers.", ", ".join(map(str, values)) + ".")
    a = rng.randint(0, 15)
    b = rng.randint(a + 4, 25)
    letters = [chr(ord("A") + i) for i in range(a, b + 1)]
    return Task("counting", f"Write the alphabet from {letters[0]} to {letters[-1]}.", ", ".join(letters) + ".")


def _arithmetic(rng: random.Random, top: int) -> Task:
    """A word problem whose numbers stay under about ``top`` (150 by default: starts up to 60, steps up to 40)."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    total = rng.randint(5, max(6, top * 2 // 5))
    story = [f"{name} has {total} {item}."]
    steps = [f"{name} starts with {total} {item}."]
    for _ in range(rng.randint(2, 3)):
        if total > 12 and rng.random() < 0.5:
            n = rng.randint(2, total - 2)
            story.append(f"Then {name} {rng.choice(_LOSSES).format(n=n)}.")
            steps.append(f"{total} - {n} = {total - n}.")
            total -= n
        else:
            n = rng.randint(2, max(3, top * 4 // 15))
            story.append(f"Then {name} {rng.choice(_GAINS).format(n=n)}.")
            steps.append(f"{total} + {n} = {total + n}.")
            total += n
    story.append(f"How many {item} does {name} have now?")
    steps.append(f"The answer is {total}.")
    return Task("arithmetic", " ".join(story), "\n".join(steps), answer=str(total))


@lru_cache(maxsize=1)
def _stdlib_snippets() -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...]]:
    """(functions, documented) of this Python's standard library, in a fixed order.

    functions: (qualified name, header with docstring, body) of short documented functions;
    documented: (qualified name, first docstring paragraph) of modules, classes and functions.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(root.glob("*.py")) + sorted(
        p for p in root.glob("*/*.py") if p.parent.name not in _SKIPPED_PACKAGES
    )
    functions, modules = [], []
    for path in paths:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        module = path.stem if path.parent == root else f"{path.parent.name}.{path.stem}"
        for node in [tree, *tree.body]:
            paragraph = _first_paragraph(node)
            if paragraph:
                name = module if node is tree else f"{module}.{node.name}"
                modules.append((name, paragraph))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not ast.get_docstring(node):
                continue
            body_start = node.body[1].lineno - 1 if len(node.body) > 1 else None
            if body_start is None or not 2 <= node.end_lineno - body_start <= 12:
                continue
            header = "\n".join(lines[node.lineno - 1 : body_start]).rstrip()
            body = "\n".join(lines[body_start : node.end_lineno]).rstrip()
            if node.decorator_list or len(header) > 600 or "\t" in header + body:
                continue
            functions.append((f"{module}.{node.name}", header, body))
    return tuple(functions), tuple(modules)


def _first_paragraph(node: ast.AST) -> str | None:
    """The first paragraph of a module, class or function docstring, if it is prose-sized."""
    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
        return None
    doc = ast.get_docstring(node)
    if not doc:
        return None
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return paragraph if 80 <= len(paragraph) <= 500 else None


def _code(rng: random.Random, top: int) -> Task:
    functions, _ = _stdlib_snippets()
    name, header, body = rng.choice(functions)
    prompt = f"Complete this Python function from the {name.split('.')[0]} module:\n{header}"
    return Task("code", prompt, body)


def _prose(rng: random.Random, top: int) -> Task:
    _, documented = _stdlib_snippets()
    name, paragraph = rng.choice(documented)
    return Task("prose", f"Explain what {name} in the Python standard library is for.", paragraph)


_MAKERS = {"counting": _counting, "arithmetic": _arithmetic, "code": _code, "prose": _prose}


def generate(kind: str, split: str, count: int, seed: int = 0, max_number: int = MAX_NUMBER) -> list[Task]:
    """``count`` distinct tasks of one kind from one split; a pure function of the arguments.

    ``max_number`` bounds the numbers of counting and arithmetic tasks (a smaller model learns
    smaller numbers sooner); the split of a prompt never depends on it.

    Code and prose have a fixed pool (the standard library), so they may return fewer.
    """
    if kind not in _MAKERS:
        raise ValueError(f"unknown task kind {kind!r}; choose from {', '.join(KINDS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    rng = random.Random(f"{seed}/{kind}")
    tasks: dict[str, Task] = {}
    attempts = 0
    while len(tasks) < count and attempts < 50 * count + 1000:
        attempts += 1
        task = _MAKERS[kind](rng, max_number)
        if split_of(task.prompt) == split:
            tasks.setdefault(task.prompt, task)
    return list(tasks.values())


def mixture(counts: dict[str, int], split: str, seed: int = 0, max_number: int = MAX_NUMBER) -> list[Task]:
    """Tasks of several kinds, shuffled together deterministically."""
    tasks = [task for kind, count in counts.items() for task in generate(kind, split, count, seed, max_number)]
    random.Random(f"{seed}/mix/{split}").shuffle(tasks)
    return tasks
