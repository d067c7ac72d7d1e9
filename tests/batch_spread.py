"""Log-probs of the same request batched differently, compared as far as vLLM's CPU kernels allow.

vLLM's CPU matmul (oneDNN's) gives a row the same float32 result whatever its batch mates on an
AVX-512 CPU, but not on one with AVX2 alone: there the kernel computes a matmul in tiles of 6 rows,
and a row that falls among the last 1 to 3 rows of a step's batch is rounded differently from one
inside a full tile (measured with ``ONEDNN_MAX_CPU_ISA=AVX2``: M mod 6 in {1, 2, 3}). So on such a
CPU the AR engine's own log-probs for one request move by about 1e-5 with what else its steps
forward (up to 1.9e-5 on the tiny test models); its tokens and ranks do not move. WeDLM's steps
forward other rows than AR's (window rows), so its log-probs can only equal AR's as exactly as
AR's equal themselves.

A test that compares log-probs across batch layouts therefore measures the AR engine's spread over
several layouts of the same requests, in the same run (``spread`` of each pair), and holds the other
side to it with ``assert_match``: everything but the floats exactly equal (tokens, ranks, texts,
lengths), and the floats exactly equal where that spread is 0 (a batch-invariant CPU), else each
within twice the spread. Twice: the spread is the largest of a sample of layouts, and WeDLM's put
other rows in the tails (WeDLM's difference to AR over the measured spread, on an emulated AVX2
CPU: at most 1.02). A spread above ``ROUNDING`` is no rounding: a row read from the wrong request,
or a wrong position, moves a log-prob by far more, and fails.
"""

from __future__ import annotations

import math

#: The largest spread that is still float32 rounding through the tiny models' layers.
ROUNDING = 1e-3


def spread(a, b) -> float:
    """The largest difference between the floats of two results of the same shape (nested lists,
    tuples and dicts of floats, ints, strings and None), asserting that everything else is equal."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, float | int) and isinstance(b, float | int), (a, b)
        if math.isinf(a) or math.isinf(b):
            assert a == b, (a, b)
            return 0.0
        return abs(a - b)
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a, b)
        return max((spread(a[key], b[key]) for key in a), default=0.0)
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), (a, b)
        return max((spread(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    assert a == b, (a, b)
    return 0.0


def largest_spread(results: list) -> float:
    """The AR engine's spread over several layouts of the same requests (``results[0]`` against each
    other), checked to be rounding."""
    measured = max(spread(results[0], other) for other in results[1:])
    assert measured < ROUNDING, f"the AR engine's own log-probs move by {measured} between batch layouts"
    return measured


def assert_match(actual, expected, ar_spread: float, what: str = "") -> None:
    """``actual`` equals ``expected`` but for float rounding within twice the AR engine's own
    ``ar_spread``; exactly, where that is 0."""
    if ar_spread == 0.0:
        assert actual == expected, what
        return
    difference = spread(actual, expected)
    assert difference <= 2 * ar_spread, f"{what}: log-probs differ by {difference}, AR's own spread is {ar_spread}"
