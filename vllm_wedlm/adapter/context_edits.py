"""Edits of a WeDLM step's logits rows that depend on the tokens before each row: repetition,
presence and frequency penalties, and bad words.

Each row gets them over the prompt and the output tokens it sees (``core.row_context``): a lossless
window's verification rows, a lossless request's first token and an AR-decoded request's rows see
exactly what AR sees, so they stay equal to ``--decoding ar``; a plain window's mask row sees the
committed output and the fills to its left. Penalties are vLLM's own ``apply_penalties`` (the op
its AR sampler runs, so the float arithmetic is AR's); a bad word's last token is banned where the
row's preceding output tokens are the rest of it (vLLM's rule), an unknown token matching nothing.

Only requests that ask for one of them are recorded: their known tokens by position live in one
device tensor, a row per table slot, allocated when the first such request arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from vllm.model_executor.layers.utils import apply_penalties

from vllm_wedlm.core.row_context import UNKNOWN, ban_bad_words, empty_history, record_tokens, record_windows, row_tokens


@dataclass(frozen=True)
class ContextEdits:
    """One request's edits that read the tokens before a row, as vLLM's ``SamplingParams`` holds them."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    bad_words: tuple[tuple[int, ...], ...] = ()  # token ids of each bad word

    @staticmethod
    def of(sampling) -> ContextEdits | None:
        """The request's edits, or None when it asks for none."""
        bad_words = tuple(tuple(word) for word in sampling.bad_words_token_ids or ())
        edits = ContextEdits(sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty,
                             bad_words)
        return None if edits == ContextEdits() else edits

    @property
    def penalises(self) -> bool:
        return bool(self.presence or self.frequency or self.repetition != 1.0)


class RowContextEdits:
    def __init__(self, layout):  # layout: row_layout.RowLayout
        self.layout = layout
        self.history: torch.Tensor | None = None  # [S, max_model_len + 1] int64 (core.row_context)

    def apply(self, logits: torch.Tensor, states: list, row_requests: np.ndarray,
              before_penalties: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """``logits`` [N, V] (float32, with the other edits: vLLM bans bad words after allowed tokens
        and penalises last) with each request's context edits applied to its rows; ``row_requests``
        [N]: each row's index into ``states``. ``before_penalties`` edits all rows between the bad
        words and the penalties (where vLLM runs its logits processors)."""
        layout = self.layout
        step, device = layout.step, layout.device
        edited = np.fromiter((s.context_edits is not None for s in states), bool, len(states))  # [B]
        self._record(states, edited)
        rows = np.flatnonzero(edited[row_requests])  # [n] host
        if not len(rows):
            return before_penalties(logits) if before_penalties else logits
        requests = row_requests[rows]  # [n]
        prompt_len = layout.prompt_lengths()  # [B]
        index = torch.from_numpy(rows).to(device, non_blocking=True)  # [n]
        slot = torch.from_numpy(step.slots[requests]).to(device, non_blocking=True)  # [n]
        begin = torch.from_numpy(prompt_len[requests]).to(device, non_blocking=True)  # [n]
        position = layout.row_positions()[index]  # [n]
        ban_bad_words(logits, index, self.history, slot, begin, position,
                      [states[i].context_edits.bad_words for i in requests])
        if before_penalties is not None:
            logits = before_penalties(logits)
        penalised = np.fromiter((states[i].context_edits.penalises for i in requests), bool, len(requests))
        if penalised.any():
            self._penalise(logits, states, rows[penalised], requests[penalised], prompt_len, slot[penalised],
                           begin[penalised], position[penalised])
        return logits

    def _penalise(self, logits, states, rows, requests, prompt_len, slot, begin, position) -> None:
        vocab, device = logits.shape[-1], logits.device
        # Widths from the host: no row predicts past its request's forwarded rows plus a window.
        longest = int((self.layout.step.committed_len[requests] + self.layout.table.capacity
                       - prompt_len[requests]).max())
        output = row_tokens(self.history, slot, begin, position, max(1, longest), vocab)  # [n, Lo]
        prompt = row_tokens(self.history, slot, torch.zeros_like(begin), begin,
                            max(1, int(prompt_len[requests].max())), vocab)  # [n, Lp]
        edits = [states[i].context_edits for i in requests]
        # [3, n], a row each: vLLM's CUDA repetition-penalty kernel takes contiguous [n] tensors only.
        presence, frequency, repetition = torch.tensor([[e.presence for e in edits], [e.frequency for e in edits],
                                                        [e.repetition for e in edits]],
                                                       dtype=logits.dtype).to(device, non_blocking=True)
        index = torch.from_numpy(rows).to(device, non_blocking=True)
        logits[index] = apply_penalties(logits[index], prompt, output, presence, frequency, repetition)

    def _record(self, states: list, edited: np.ndarray) -> None:
        """Write what this step forwards for the requests with context edits: a new one's prompt
        first, then every forwarded token, then the windows over them (masks unknown)."""
        if not edited.any():
            return
        layout = self.layout
        step, runner, device, table = layout.step, layout.runner, layout.device, layout.table
        if self.history is None or self.history.shape[0] < table.num_slots:
            grown = empty_history(table.num_slots, layout.max_model_len, device)
            if self.history is not None:
                grown[: self.history.shape[0]] = self.history
            self.history = grown
        for i in np.flatnonzero(edited):
            # A new request's slot may hold an earlier request's tokens, and an AR request's tokens
            # that steps vLLM ran whole forwarded (model_runner.py) were not recorded: its history is
            # written afresh from what vLLM holds (an output placeholder of async scheduling, not
            # known yet, stays unknown).
            if states[i].history_at != runner.wedlm_vllm_steps:
                slot = int(step.slots[i])
                request = runner.requests[step.req_ids[i]]
                known = torch.tensor((request.prompt_token_ids or []) + request.output_token_ids, dtype=torch.long)
                self.history[slot] = UNKNOWN
                self.history[slot, : len(known)] = torch.where(known >= 0, known, UNKNOWN).to(device)
                states[i].history_at = runner.wedlm_vllm_steps
        num_reqs = len(states)
        bounds = runner.query_start_loc.np[: num_reqs + 1].astype(np.int64)
        token_request = np.repeat(np.arange(num_reqs), np.diff(bounds))  # [T]
        total = len(token_request)
        token = runner.input_ids.gpu[:total].to(torch.long)  # [T]
        # A WeDLM request's mask ids are not tokens (its window's masks, padding rows); an
        # AR-decoded request forwards only tokens.
        recorded = torch.from_numpy(edited[token_request]).to(device, non_blocking=True)
        autoregressive = torch.from_numpy(step.autoregressive[token_request]).to(device, non_blocking=True)
        keep = recorded & (autoregressive | (token != layout.mask_id))
        record_tokens(self.history, torch.from_numpy(step.slots[token_request]).to(device, non_blocking=True),
                      runner.positions[:total].to(torch.long), token, keep)
        windows = np.flatnonzero(step.window & edited)
        if len(windows):
            slots = step.slots[windows]
            index = torch.from_numpy(slots).to(device, non_blocking=True)
            planned = table.windows.rows(index)
            record_windows(self.history, index, layout.window_starts(slots), planned.tokens, planned.filled,
                           planned.length)
