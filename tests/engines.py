"""Starting and stopping real vLLM engines inside the tests."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import torch

from conftest import forget_vllm_environment
from vllm_wedlm.engine_settings import engine_kwargs


@contextlib.contextmanager
def running_llm(model: Path, **overrides) -> Iterator:
    """A ``vllm.LLM`` on ``model`` for the duration of the block, its engine process stopped after."""
    from vllm import LLM

    llm = LLM(str(model), **engine_kwargs(**overrides))
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        forget_vllm_environment()  # the next engine may run under other variables


def kv_bytes_per_token(config) -> int:
    """KV cache bytes one token takes in a float32 engine of ``config`` (a WeDLMConfig): K and V."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4


def vllm_prompt_logprobs(llm, prompt: str) -> tuple[list[int], torch.Tensor]:
    """Prompt token ids and vLLM's full-vocabulary log-probs of each next token, [len-1, vocab]."""
    from vllm import SamplingParams

    vocab = llm.llm_engine.model_config.get_vocab_size()
    out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)[0]
    rows = []
    for position in out.prompt_logprobs[1:]:  # entry 0 is None: nothing predicts the first token
        row = torch.full((vocab,), float("nan"))
        for token_id, logprob in position.items():
            row[token_id] = logprob.logprob
        rows.append(row)
    return list(out.prompt_token_ids), torch.stack(rows)
