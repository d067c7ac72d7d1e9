"""Starting and stopping real vLLM engines inside the tests."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

from vllm_wedlm.testing import engine_kwargs


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
