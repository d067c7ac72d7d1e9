"""Shared fixtures: tiny WeDLM checkpoints of both published variants, made once per session.

Every checkpoint carries ``auto_map`` remote-code files that raise when imported, as the real
checkpoints carry remote code: anything that loads them without trust_remote_code proves that
the plugin's local classes were used and the remote code never ran.
"""

from __future__ import annotations

import os
from importlib.metadata import version

if version("vllm").startswith("0.34."):
    # tests/v034's environment (its conftest.py says why), set before anything imports Triton:
    # functions of Triton's own library (tl.cdiv, which vLLM's penalty kernel calls) run in its
    # interpreter only when they were decorated with TRITON_INTERPRET=1 set.
    os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", VLLM_TARGET_DEVICE="cpu",
                      VLLM_ENABLE_V1_MULTIPROCESSING="0")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint  # noqa: E402
from vllm_wedlm.models.configuration_wedlm import BODIES  # noqa: E402

# tests/v034 need vLLM 0.34 (.venv034, scripts/setup-vllm034.sh): scripts/test.sh runs them there.
collect_ignore = [] if version("vllm").startswith("0.34.") else ["v034"]

VARIANTS = tuple(BODIES)  # the published bodies: ("qwen2", "qwen3")

REMOTE_CODE_SENTINEL = 'raise RuntimeError("remote code of the checkpoint was executed")\n'


def add_remote_code_sentinels(path: Path) -> None:
    for name in ("configuration_wedlm.py", "modeling_wedlm.py"):
        (path / name).write_text(REMOTE_CODE_SENTINEL)


def build_checkpoint(root: Path, spec: TinySpec) -> Path:
    path = make_tiny_checkpoint(root / f"{spec.variant}-seed{spec.seed}-scale{spec.logit_scale}", spec)
    add_remote_code_sentinels(path)
    return path


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One checkpoint per variant. logit_scale 8 gives peaked, non-uniform predictions, so
    greedy choices are decided by real margins rather than rounding noise."""
    root = tmp_path_factory.mktemp("tiny")
    return {v: build_checkpoint(root, TinySpec(variant=v, logit_scale=8.0)) for v in VARIANTS}


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request) -> str:
    return request.param


def pytest_configure(config: pytest.Config) -> None:
    # `pytest -m fast`: the core algorithm, the reference decoder and the batched step, no vLLM
    # engine (README, "Tests"); CI runs every test, marked or not.
    config.addinivalue_line("markers", "fast: the fast tier (no vLLM engine; under two minutes in all)")
