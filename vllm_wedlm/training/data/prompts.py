"""Prompts for self-distillation: what a pretrained model is asked so that its own answers become its
WeDLM training data.

Kinds: the task generator's four (tasks.py: counting, arithmetic, code, prose; their prompts only,
the model answers them itself), and open-ended ones built from text on this machine, the docstrings
of the running Python's standard library:

* ``question``: an open question about a module, class or function of the standard library;
* ``summary``: summarise a docstring paragraph;
* ``explain``: explain a docstring paragraph to a beginner;
* ``continue``: continue a text that starts with a docstring paragraph's first sentence.

No benchmark's problems are used. Same arguments, same prompts; a prompt's split is
:func:`tasks.split_of` of its text, so held-out prompts never reach the training data.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from functools import lru_cache

from vllm_wedlm.training.data.stdlib import stdlib_modules
from vllm_wedlm.training.data.tasks import KINDS, SPLITS, generate, split_of

OPEN_KINDS = ("question", "summary", "explain", "continue")
DISTILL_KINDS = KINDS + OPEN_KINDS
_QUESTIONS = (
    "What is {name} in the Python standard library used for? Give a short example.",
    "When would a programmer use {name} in Python, and when not?",
    "How do I use {name} in Python? Explain step by step.",
    "What are common mistakes people make with {name} in Python?",
    "Describe {name} from the Python standard library to someone new to Python.",
)


@dataclass(frozen=True)
class Prompt:
    kind: str
    text: str  # the user's message
    source: str  # where it was built from, for the data's provenance


@lru_cache(maxsize=1)
def docstring_paragraphs() -> tuple[tuple[str, str], ...]:
    """(qualified name, paragraph) of every prose-sized docstring paragraph in the standard library
    (modules, classes, functions and methods), in a fixed order."""
    found = []
    for module in stdlib_modules():
        for node, name in _documented(module.tree, module.name):
            for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
                text = " ".join(paragraph.split())
                if 120 <= len(text) <= 700 and ">>>" not in text and not text.startswith(("..", "-", "*", "=")):
                    found.append((name, text))
    return tuple(found)


def _documented(tree: ast.Module, module: str):
    yield tree, module
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node, f"{module}.{node.name}"
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                        yield member, f"{module}.{node.name}.{member.name}"


def _open_prompt(kind: str, rng: random.Random) -> Prompt:
    paragraphs = docstring_paragraphs()
    name, paragraph = paragraphs[rng.randrange(len(paragraphs))]
    source = f"docstring of {name}"
    if kind == "question":
        return Prompt(kind, rng.choice(_QUESTIONS).format(name=name), f"name of {name}")
    if kind == "summary":
        return Prompt(kind, f"Summarize this text in one or two sentences:\n\n{paragraph}", source)
    if kind == "explain":
        return Prompt(kind, f"Explain this to a beginner, in simple words:\n\n{paragraph}", source)
    first = paragraph.split(". ")[0].rstrip(".") + "."
    return Prompt(kind, f"Continue this text with a few more sentences:\n\n{first}", source)


def distill_prompts(kind: str, split: str, count: int, seed: int = 0) -> list[Prompt]:
    """``count`` distinct prompts of one kind from one split (fewer if the kind's pool is smaller)."""
    if kind not in DISTILL_KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}; choose from {', '.join(DISTILL_KINDS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if kind in KINDS:
        return [Prompt(kind, task.prompt, f"vllm_wedlm.training.data.tasks {kind} generator, seed {seed}")
                for task in generate(kind, split, count, seed)]
    rng = random.Random(f"{seed}/distill/{kind}")
    prompts: dict[str, Prompt] = {}
    attempts = 0
    while len(prompts) < count and attempts < 50 * count + 1000:
        attempts += 1
        prompt = _open_prompt(kind, rng)
        if split_of(prompt.text) == split:
            prompts.setdefault(prompt.text, prompt)
    return list(prompts.values())


def prompt_mixture(counts: dict[str, int], split: str = "train", seed: int = 0) -> list[Prompt]:
    """Prompts of several kinds, shuffled together deterministically."""
    prompts = [p for kind, count in counts.items() for p in distill_prompts(kind, split, count, seed)]
    random.Random(f"{seed}/distill-mix/{split}").shuffle(prompts)
    return prompts
