"""Starting and stopping real vLLM engines inside the tests."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from vllm_wedlm.engine_settings import engine_kwargs, on_gpu

#: vLLM's switch between an engine core in a process of its own and one in the caller's.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: In-process engines alive now: at most one, as vLLM's parallel groups are the process's (a
#: second one's shutdown would tear down the first's); an engine started beside one gets a process.
_in_process_engines: list[object] = []


@contextlib.contextmanager
def running_llm(model: Path, in_process: bool | None = None, **overrides) -> Iterator:
    """A ``vllm.LLM`` on ``model`` for the duration of the block, its engine core stopped after.

    On the CPU the engine core runs inside the test process (vLLM's in-process client): a process of
    its own imports torch and vLLM afresh, about half a minute on two cores for each of the suite's
    engines, which the CI's time limit cannot afford. Only the engine's construction sees the
    switch, so processes the tests start meanwhile (``vllm serve``, the demo) run as users run them.
    Not on a GPU, where memory an engine leaves in the test process would shrink the next one's share,
    nor beside another in-process engine (``_in_process_engines``). ``in_process=True`` asks for it on a
    GPU too: a test that patches the scheduler's module (its engine core must be this process's).
    """
    from vllm import LLM

    before = os.environ.get(MULTIPROCESSING_ENV)
    if in_process is None:
        in_process = not on_gpu()
    in_process = in_process and not _in_process_engines
    if in_process:
        os.environ[MULTIPROCESSING_ENV] = "0"
    try:
        llm = LLM(str(model), **engine_kwargs(**overrides))
    finally:
        if before is None:
            os.environ.pop(MULTIPROCESSING_ENV, None)
        else:
            os.environ[MULTIPROCESSING_ENV] = before
        # An engine core's start turns on vLLM's cache of environment variables, in-process this
        # process's: later engines (and tests) must read them afresh.
        envs = sys.modules.get("vllm.envs")
        if envs is not None:
            envs.disable_envs_cache()
    if in_process:
        _in_process_engines.append(llm)
    try:
        yield llm
    finally:
        if in_process:
            _in_process_engines.remove(llm)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


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
