"""Shared fixtures: tiny WeDLM checkpoints of both published variants, made once per session.

Every checkpoint carries ``auto_map`` remote-code files that raise when imported, as the real
checkpoints carry remote code: anything that loads them without trust_remote_code proves that
the plugin's local classes were used and the remote code never ran.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint
from vllm_wedlm.models.configuration_wedlm import BODIES

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
