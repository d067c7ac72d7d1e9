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


def test_wedlm_modes_run_the_engine_default_unless_a_suffix_or_the_run_fixes_w():
    """A plain ``wedlm:TAU`` or ``lossless:TAU`` mode runs the engine's default (the adaptive window,
    no window key); ``+wN`` fixes W N for its engine (an engine of its own); the run's
    ``--window-size`` fixes W for the rest, but ``+auto``. Every row records what its engine ran."""
    plain, lossless, fixed, auto = modes = parse_modes("wedlm:0.4,lossless:0.4,wedlm:0.4+w16,wedlm:0.4+auto+sync")
    assert list(by_engine(modes)) == ["wedlm", "wedlm+w16", "wedlm+auto+sync"]
    assert plain.additional_config() == lossless.additional_config() == {"decoding": "wedlm"}
    assert plain.window_settings() == {"window_size": 16, "adaptive_window": True, "window_tokens": None}
    assert fixed.additional_config() == fixed.additional_config(8) == {"decoding": "wedlm", "window_size": 16}
    assert fixed.window_settings(8) == {"window_size": 16, "adaptive_window": False, "window_tokens": None}
    assert plain.additional_config(8) == {"decoding": "wedlm", "window_size": 8}
    assert plain.window_settings(8)["adaptive_window"] is False
    assert auto.additional_config(16) == {"decoding": "wedlm"} and auto.scheduling == "sync"
    assert plain.additional_config(32, 128) == {"decoding": "wedlm", "window_size": 32, "window_tokens": 128}
    assert plain.window_settings(32, 128) == {"window_size": 32, "adaptive_window": True, "window_tokens": 128}
    assert parse_modes("ar")[0].window_settings(8) == {"window_size": None, "adaptive_window": None,
                                                       "window_tokens": None}
    assert (fixed.widest_window(), plain.widest_window(), plain.widest_window(8)) == (16, 16, 8)
    with pytest.raises(ValueError, match="needs --window-tokens"):
        auto.additional_config(8)
    for text in ("ar+w16", "wedlm-ar+w8", "wedlm:0.4+w0", "wedlm:0.4+w16+w8", "wedlm:0.4+w16+auto",
                 "wedlm:0.4+sync+w16"):
        with pytest.raises(ValueError):
            parse_modes(text)
