"""A small deterministic text corpus to train the tiny checkpoints' tokenizer on.

It mixes the kinds of text WeDLM is used for (counting, arithmetic, code, prose, chat) so the
trained BPE has merges for all of them. Same seed, same text, on every machine.
"""

from __future__ import annotations

import random

_NOUNS = "river model window token cache engine garden signal number answer story lamp".split()
_VERBS = "reads writes counts moves builds finds keeps shows turns holds".split()
_ADJS = "quiet bright small large early late simple careful rapid steady".split()
_NAMES = "Ada Ben Cleo Dev Eli Fay Gus Hana".split()


def _prose(rng: random.Random) -> str:
    words = [rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_VERBS), "the", rng.choice(_NOUNS)]
    return "The " + " ".join(words) + "."


def _counting(rng: random.Random) -> str:
    start = rng.randint(0, 200)
    return ", ".join(str(start + i) for i in range(rng.randint(5, 30)))


def _arithmetic(rng: random.Random) -> str:
    name, a, b = rng.choice(_NAMES), rng.randint(2, 99), rng.randint(2, 99)
    return f"{name} has {a} apples and buys {b} more. {a} + {b} = {a + b}. The answer is {a + b}."


def _code(rng: random.Random) -> str:
    name, n = rng.choice(_NOUNS), rng.randint(1, 9)
    return f"def {name}_{n}(x):\n    return x * {n} + {rng.randint(0, 9)}\n"


def _chat(rng: random.Random) -> str:
    return f"<|im_start|>user\n{_arithmetic(rng)}<|im_end|>\n<|im_start|>assistant\n{_prose(rng)}<|im_end|>\n"


def corpus(seed: int, num_lines: int = 4000) -> list[str]:
    """``num_lines`` lines of mixed text, a pure function of ``seed``."""
    rng = random.Random(seed)
    makers = (_prose, _counting, _arithmetic, _code, _chat)
    return [makers[i % len(makers)](rng) for i in range(num_lines)]
