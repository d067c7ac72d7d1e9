"""Decoding modes of a benchmark run, and which of them can share one engine.

* ``ar``: vLLM's ordinary one-token-per-forward decoding;
* ``ar-v1``: the same on vLLM's V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``), the runner a WeDLM
  engine builds on (vLLM 0.26.0 runs AR on a GPU with its V2 runner): what of a WeDLM engine's gap
  to ``ar`` is the runner's;
* ``ngram`` or ``ngram:K``: AR plus vLLM's n-gram (prompt lookup) speculative decoding with K
  proposed tokens (default 4): the speed-up a user can switch on without extra weights;
* ``wedlm`` or ``wedlm:TAU``: WeDLM decoding at entropy threshold TAU (default the server's);
  ``wedlm:inf`` fills every mask each step (whole windows commit: the engine's ceiling);
* ``lossless`` or ``lossless:TAU``: WeDLM with every fill verified against the AR prediction
  (``wedlm_lossless``): AR's output, drafted at threshold TAU (``lossless:inf`` drafts every mask);
* ``wedlm-ar``: requests decoded AR on a WeDLM engine (``wedlm_decoding: ar``): one token per
  forward, as ``ar``, on the engine WeDLM requests run on (what mixing the two modes costs);
* a ``+async`` or ``+sync`` suffix on a WeDLM, lossless or ``wedlm-ar`` mode (``wedlm:0.4+sync``):
  its engine runs with ``--async-scheduling`` (fixed window rows, GPU only) or
  ``--no-async-scheduling`` (exact window rows); without one, the engine's default (on a GPU, async
  scheduling for a model whose forward hides the host's work, synchronous for a smaller one:
  ``adapter/async_gate.py``; on a CPU, synchronous). Each result row records the scheduling that ran;
* the window: a WeDLM or lossless mode runs the engine's default, the adaptive window (each request's
  W per step, at most 16), unless the run gives ``--window-size N`` (a fixed W N for every WeDLM
  engine) or ``--window-tokens`` (that knee, at most ``--window-size``). A ``+wN`` suffix
  (``wedlm:0.4+w16``, before any ``+async``) fixes W N for that mode's engine whatever the run's
  flags; a ``+auto`` suffix keeps the adaptive window where ``--window-size`` would fix it. Each
  result row records the window settings its engine ran (``window_settings``).

All WeDLM, lossless and ``wedlm-ar`` modes of the same suffixes share one engine (all are per-request
knobs); AR and each n-gram setting need their own.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from vllm_wedlm.config import (
    AUTO_WINDOW,
    REQUEST_DECODING,
    REQUEST_ENTROPY_THRESHOLD,
    REQUEST_LOSSLESS,
    WeDLMSettings,
    max_window_tokens,
)
from vllm_wedlm.core.params import DEFAULT_WINDOW_SIZE, validate_window_size

DEFAULT_NGRAM_TOKENS = 4
#: Suffix -> the engine's scheduling: vLLM's --async-scheduling / --no-async-scheduling.
SCHEDULING_SUFFIXES = {"+async": "async", "+sync": "sync"}
ADAPTIVE_SUFFIX = "+auto"
FIXED_WINDOW_SUFFIX = re.compile(r"\+w(\d+)$")  # "+w16": a fixed W of 16
FILL_ALL = 1e9  # above any entropy (at most log(vocab)): every mask fills
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's switch of runner; "0": its V1 runner


@dataclass(frozen=True)
class Mode:
    name: str
    decoding: str  # "ar" or "wedlm"
    ngram_tokens: int = 0  # speculative tokens of the n-gram proposer, 0 = off
    entropy_threshold: float | None = None  # WeDLM's tau for this mode's requests, None = server default
    lossless: bool = False  # WeDLM requests whose fills are verified (AR's output)
    scheduling: str | None = None  # a WeDLM engine's: "async", "sync" or None (the engine's default)
    per_request_ar: bool = False  # requests decoded AR on a WeDLM engine (one token per forward)
    adaptive: bool = False  # ``+auto``: the adaptive window even where the run fixes W (--window-size)
    fixed_window: int | None = None  # ``+wN``: a fixed W of N for this mode's engine
    v1_runner: bool = False  # an AR engine on vLLM's V1 model runner

    @property
    def windows(self) -> bool:
        """Whether its requests decode in WeDLM windows (forwards counted as windows)."""
        return self.decoding == "wedlm" and not self.per_request_ar

    @property
    def engine(self) -> str:
        """Modes with equal ``engine`` run on one engine."""
        if self.ngram_tokens:
            return f"ngram:{self.ngram_tokens}"
        if self.v1_runner:
            return self.name
        return (self.decoding + (ADAPTIVE_SUFFIX if self.adaptive else "")
                + (f"+w{self.fixed_window}" if self.fixed_window else "")
                + (f"+{self.scheduling}" if self.scheduling else ""))

    def additional_config(self, window_size: int | None = None, window_tokens: int | None = None) -> dict:
        """The engine's WeDLM settings. ``window_size``: the run's ``--window-size`` (None: not given),
        a fixed W for every WeDLM engine, or with ``window_tokens`` (the adaptive window's knee) the
        most W; neither: the engine's default, the adaptive window. A ``+wN`` mode fixes its own."""
        if self.decoding != "wedlm":
            return {"decoding": "ar"}
        if self.fixed_window is not None:
            return {"decoding": "wedlm", "window_size": self.fixed_window}
        if window_tokens is not None:
            return {"decoding": "wedlm", "window_size": widest_window(window_size), "window_tokens": window_tokens}
        if window_size is not None and not self.adaptive:
            return {"decoding": "wedlm", "window_size": window_size}
        if widest_window(window_size) != DEFAULT_WINDOW_SIZE:
            raise ValueError(f"{self.name}: an adaptive window of at most W {window_size} needs --window-tokens "
                             f"(its knee); '{AUTO_WINDOW}' means at most {DEFAULT_WINDOW_SIZE}")
        return {"decoding": "wedlm"}  # the engine's default: the adaptive window

    def window_settings(self, window_size: int | None = None, window_tokens: int | None = None) -> dict:
        """What a result row records of the window its engine ran (None for AR engines): the W (the
        most, where adaptive), whether it was adaptive, and its knee, read as the engine reads them."""
        config = self.additional_config(window_size, window_tokens)
        if config["decoding"] != "wedlm":
            return {"window_size": None, "adaptive_window": None, "window_tokens": None}
        settings = WeDLMSettings.from_additional_config(config)
        return {"window_size": settings.window_size, "adaptive_window": settings.adaptive_window,
                "window_tokens": settings.window_tokens}

    def widest_window(self, window_size: int | None = None) -> int:
        """The most slots a window of this mode's engine may have."""
        return self.fixed_window or widest_window(window_size)

    def speculative_config(self) -> dict | None:
        if not self.ngram_tokens:
            return None
        return {"method": "ngram", "num_speculative_tokens": self.ngram_tokens,
                "prompt_lookup_min": 2, "prompt_lookup_max": 5}

    def extra_args(self) -> dict | None:
        if self.per_request_ar:
            return {REQUEST_DECODING: "ar"}
        args = {} if self.entropy_threshold is None else {REQUEST_ENTROPY_THRESHOLD: self.entropy_threshold}
        if self.lossless:
            args[REQUEST_LOSSLESS] = True
        return args or None


def parse_mode(text: str) -> Mode:
    text = text.strip()
    fixed = FIXED_WINDOW_SUFFIX.search(text)
    if text.endswith(ADAPTIVE_SUFFIX) or fixed:
        suffix = fixed.group(0) if fixed else ADAPTIVE_SUFFIX
        mode = parse_mode(text[: -len(suffix)])
        if not mode.windows or mode.scheduling or mode.adaptive or mode.fixed_window:
            raise ValueError(f"{suffix} is for WeDLM and lossless modes, once, before any +async or +sync: {text!r}")
        if fixed:
            return replace(mode, name=mode.name + suffix, fixed_window=validate_window_size(int(fixed.group(1))))
        return replace(mode, name=mode.name + suffix, adaptive=True)
    for suffix, scheduling in SCHEDULING_SUFFIXES.items():
        if text.endswith(suffix):
            mode = parse_mode(text[: -len(suffix)])
            if mode.decoding != "wedlm":
                raise ValueError(f"{suffix} is for WeDLM, lossless and wedlm-ar modes (AR engines keep vLLM's "
                                 f"default): {text!r}")
            return replace(mode, name=mode.name + suffix, scheduling=scheduling)
    kind, _, arg = text.partition(":")
    if kind == "ar" and not arg:
        return Mode("ar", "ar")
    if kind == "ar-v1" and not arg:
        return Mode("ar-v1", "ar", v1_runner=True)
    if kind == "wedlm-ar" and not arg:
        return Mode("wedlm-ar", "wedlm", per_request_ar=True)
    if kind == "ngram":
        tokens = int(arg) if arg else DEFAULT_NGRAM_TOKENS
        if tokens < 1:
            raise ValueError(f"ngram needs at least one speculative token: {text!r}")
        return Mode(f"ngram:{tokens}", "ar", ngram_tokens=tokens)
    if kind in ("wedlm", "lossless"):
        lossless = kind == "lossless"
        if not arg:
            return Mode(kind, "wedlm", lossless=lossless)
        tau = FILL_ALL if arg == "inf" else float(arg)
        if not math.isfinite(tau) or tau < 0:
            raise ValueError(f"WeDLM threshold must be a non-negative number or 'inf': {text!r}")
        return Mode(f"{kind}:{arg}", "wedlm", entropy_threshold=tau, lossless=lossless)
    raise ValueError(f"unknown mode {text!r}: use ar, ar-v1, ngram[:K], wedlm[:TAU], wedlm:inf, lossless[:TAU] or "
                     "wedlm-ar, the WeDLM ones with +wN, +auto, +async or +sync")


@contextmanager
def runner_env(mode: Mode) -> Iterator[None]:
    """Start a mode's engine (in-process or a server) inside this: an ``ar-v1`` engine gets vLLM's
    V1 runner from the environment its processes start with; every other mode vLLM's default."""
    if not mode.v1_runner:
        yield
        return
    before = os.environ.get(V2_RUNNER_ENV)
    os.environ[V2_RUNNER_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[V2_RUNNER_ENV]
        else:
            os.environ[V2_RUNNER_ENV] = before


def parse_modes(text: str) -> list[Mode]:
    modes = [parse_mode(part) for part in text.split(",") if part.strip()]
    if len({m.name for m in modes}) != len(modes):
        raise ValueError(f"a mode is listed twice: {text!r}")
    return modes


def parse_window_size(text: str) -> int | str:
    """A W on a command line: an integer, or ``auto`` (the adaptive window)."""
    return AUTO_WINDOW if text == AUTO_WINDOW else int(text)


def widest_window(window_size: int | str | None) -> int:
    """The most slots a window of ``window_size`` may have: an adaptive one's (``auto``) and the
    server's default (None, the adaptive window) are the default W's."""
    return window_size if isinstance(window_size, int) else DEFAULT_WINDOW_SIZE


def token_budget(max_batch: int, window_size: int) -> int:
    """``max_num_batched_tokens`` for every engine of a run: a full batch of WeDLM windows fits one
    step, and AR gets the same budget."""
    return max(8192, max_batch * max_window_tokens(window_size))


def by_engine(modes: list[Mode]) -> dict[str, list[Mode]]:
    groups: dict[str, list[Mode]] = {}
    for mode in modes:
        groups.setdefault(mode.engine, []).append(mode)
    return groups
