"""Two custom vLLM logits processors for the tests, written as a vLLM user writes one (vLLM's
``LogitsProcessor`` interface, per-request settings in ``extra_args`` / ``vllm_xargs``).

* ``ForceTokens``: ``force_tokens: [index, token, index, token, ...]`` makes the row that predicts
  output index ``index`` pick ``token`` (every other token gets -inf). It reads only how many output
  tokens precede the row, so a plain WeDLM window must obey it exactly.
* ``NoRepeatBigram``: ``no_repeat_bigram: true`` bans every token that would complete a bigram the
  request's text (prompt and output) already holds. It reads the tokens before the row, so a
  lossless window must equal AR with it only if each row sees AR's context.

Loaded by qualified name (``example_processors:ForceTokens``): the tests directory is on the
engine's import path (pytest puts it on ``sys.path``; a server gets it in ``PYTHONPATH``).
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


class ForceTokens(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.requests: dict[int, tuple[dict[int, int], list[int]]] = {}  # batch index -> (index -> token, output)

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        values = (params.extra_args or {}).get("force_tokens", [])
        if len(values) % 2 or not all(isinstance(value, int) and value >= 0 for value in values):
            raise ValueError("force_tokens must be a flat list of [index, token] pairs of non-negative integers")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, prompt: list[int] | None, output: list[int]):
            values = (params.extra_args or {}).get("force_tokens")
            return (dict(zip(values[::2], values[1::2], strict=True)), output) if values else None

        process_dict_updates(self.requests, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (forced, output) in self.requests.items():
            token = forced.get(len(output))
            if token is not None:
                kept = logits[row, token].clone()
                logits[row] = float("-inf")
                logits[row, token] = kept
        return logits


class NoRepeatBigram(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.requests: dict[int, tuple[list[int], list[int]]] = {}  # batch index -> (prompt, output)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params: SamplingParams, prompt: list[int] | None, output: list[int]):
            return (prompt or [], output) if (params.extra_args or {}).get("no_repeat_bigram") else None

        process_dict_updates(self.requests, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (prompt, output) in self.requests.items():
            text = prompt + output
            if not text:
                continue
            banned = [text[k + 1] for k in range(len(text) - 1) if text[k] == text[-1]]
            if banned:
                logits[row, torch.tensor(banned, dtype=torch.long, device=logits.device)] = float("-inf")
        return logits
