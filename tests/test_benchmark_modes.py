"""The benchmark harness's modes (``benchmarks/modes.py``): which engine each needs, and the V1-runner
AR engine's environment, which must reach the engine's processes and leave the harness's as it was."""

from __future__ import annotations

import os

import pytest

from benchmarks.modes import V2_RUNNER_ENV, by_engine, parse_modes, runner_env

pytestmark = pytest.mark.fast


def test_ar_on_the_v1_runner_is_an_engine_of_its_own():
    modes = parse_modes("ar,ar-v1,wedlm:0.4,wedlm-ar,wedlm:0.4+auto")
    assert list(by_engine(modes)) == ["ar", "ar-v1", "wedlm", "wedlm+auto"]
    ar_v1 = modes[1]
    assert (ar_v1.decoding, ar_v1.v1_runner, ar_v1.windows, ar_v1.extra_args()) == ("ar", True, False, None)
    assert ar_v1.additional_config(16) == {"decoding": "ar"}
    for text in ("ar-v1:2", "ar-v1+async", "ar-v1+auto"):
        with pytest.raises(ValueError):
            parse_modes(text)


@pytest.mark.parametrize("before", [None, "1"])
def test_the_v1_runner_environment_is_set_only_while_its_engine_starts(monkeypatch, before):
    if before is None:
        monkeypatch.delenv(V2_RUNNER_ENV, raising=False)
    else:
        monkeypatch.setenv(V2_RUNNER_ENV, before)
    ar, ar_v1 = parse_modes("ar,ar-v1")
    with runner_env(ar_v1):
        assert os.environ[V2_RUNNER_ENV] == "0"
    assert os.environ.get(V2_RUNNER_ENV) == before
    with runner_env(ar):
        assert os.environ.get(V2_RUNNER_ENV) == before
    with pytest.raises(RuntimeError), runner_env(ar_v1):
        raise RuntimeError("the engine failed to start")
    assert os.environ.get(V2_RUNNER_ENV) == before
