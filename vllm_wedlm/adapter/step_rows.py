"""The plain records a WeDLM step shares between its row layout and its stages: each request's
state in the runner (``RequestState``, kept from its first step to its end) and what each request
of the input batch does in the step (``StepRows``). A module of their own, so that the stages
(grammar_rows.py, token_logprobs.py) read them without importing the layouts that call them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_wedlm.adapter.context_edits import ContextEdits
from vllm_wedlm.adapter.protocol import RequestRecord
from vllm_wedlm.core.logit_edits import LogitEdits
from vllm_wedlm.core.params import WeDLMParams


@dataclass
class RequestState:
    """The runner's state of one request in WeDLM mode, kept from its first step to its end.

    vLLM's scheduler knows a window only as the request's output tokens not yet forwarded (its
    leading filled run) and its draft tokens; it drops the drafts when it preempts the request
    (and sets ``num_computed_tokens`` to 0), while the output tokens stay in the request and are
    re-prefilled. So the window (tokens, which slots are filled, its physical order) lives in the
    runner's ``WindowTable`` at ``slot`` and survives preemption: the next forward after the
    re-prefill is the one the request would have run without it, so its output does not depend on
    preemption.
    """

    slot: int
    record: RequestRecord  # what the request asks (``protocol.classify``), read once
    has_window: bool = False  # a window is planned at ``slot`` (its input ids went out as drafts)
    # W of that window as planned (the adaptive window's choice; 0: a window of its leading run
    # alone, which draws its next token from the run's last row; -1: none planned yet).
    window_size: int = -1
    # The runner's count of steps vLLM ran whole when its token history (context_edits.py) was
    # written: those steps record nothing, so a history older than one is written again.
    history_at: int | None = None
    # Structured outputs decoded in windows: the runner follows its grammar (grammar_rows.WindowGrammars).
    grammar: bool = False

    # What the layouts and stages read of the record.
    @property
    def params(self) -> WeDLMParams:
        return self.record.params

    @property
    def autoregressive(self) -> bool:
        """Decoded AR on this engine (``wedlm_decoding: "ar"``, or what only AR serves): no window.
        Each step forwards the tokens it has not forwarded yet and draws the next token from the
        last row, as vLLM's own sampler does in --decoding ar."""
        return not self.record.windowed

    @property
    def edits(self) -> LogitEdits | None:
        """allowed_token_ids, logit_bias and min_tokens, applied to each of its logits rows."""
        return self.record.edits

    @property
    def min_p(self) -> float:
        return self.record.min_p

    @property
    def context_edits(self) -> ContextEdits | None:
        """Penalties and bad words, which read the tokens before each row."""
        return self.record.context_edits

    @property
    def logprobs(self) -> bool:  # asks for the log-probs of its tokens (token_logprobs.py)
        return self.record.logprobs

    @property
    def logprob_token_ids(self) -> tuple[int, ...] | None:  # ... of these token ids rather than the top K
        return self.record.logprob_token_ids


@dataclass
class StepRows:
    """What each request of the input batch does in the current step ([B] arrays, batch order)."""

    req_ids: list[str]
    slots: np.ndarray  # int64, WindowTable slot
    autoregressive: np.ndarray  # bool: a request decoded AR on this engine (wedlm_decoding: ar)
    window: np.ndarray  # bool: forwards its WeDLM window
    completes_prefill: np.ndarray  # bool: forwards up to the request's last token, no window
    lossless: np.ndarray  # bool: a WeDLM request whose fills are verified (WeDLMParams.lossless)
    ar_next: np.ndarray  # bool: draws the next token from its last row (AR requests, every full step)
    first_token: np.ndarray  # bool: a lossless request draws its first token from the prompt's last row
    committed_len: np.ndarray  # int64: tokens with exact KV once this step's prefill chunk is in
    num_logits: np.ndarray  # int64: logits rows: num_checks first rows, then the request's last ones
    num_checks: np.ndarray  # int64: a lossless window's verification rows (its leading run, first rows)
    window_sizes: np.ndarray  # int64: W of the window the request plans at the step's end

    @property
    def num_ar_rows(self) -> np.ndarray:
        """[B] int64: next-token rows among each request's logits rows (the first ones)."""
        return self.num_checks + (self.ar_next | self.first_token)
