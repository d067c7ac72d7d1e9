"""The plugin's settings are strict where they are the plugin's, and left alone where they are not.

A misspelt WeDLM key must fail loudly (a silent default decodes differently from what was asked),
at start-up for ``additional_config`` and per request for ``extra_args`` / ``vllm_xargs`` (a 400
from ``vllm serve``: tests/test_serve_wedlm.py). Keys that belong to vLLM or to other plugins pass.
The engine's config is built for real (``EngineArgs.create_engine_config``, what ``vllm serve``
and ``vllm.LLM`` call); no engine is started.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_wedlm
from plain_qwen import plain_qwen3_copy

ACCEPTED_SETTINGS = ("'ar_step_cost', 'async_padding_tokens', 'decoding', 'entropy_threshold', 'fixed_window_rows', "
                     "'lossless', 'pos_penalty', 'window_size', 'window_tokens'")
ACCEPTED_REQUEST_KEYS = ("'wedlm_decoding', 'wedlm_entropy_threshold', 'wedlm_lossless', 'wedlm_pos_penalty', "
                         "'wedlm_window_size'")


class PlatformConfig:
    """A non-dict ``additional_config``, as vLLM allows for a platform's own settings."""

    def compute_hash(self) -> str:
        return "platform-settings"


def engine_config(model, additional_config, **kwargs):
    vllm_wedlm.register()
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model), max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 26,
                      additional_config=additional_config, **kwargs).create_engine_config()


@pytest.fixture(scope="module")
def plain_qwen(tiny_checkpoints, tmp_path_factory):
    return plain_qwen3_copy(tiny_checkpoints["qwen3"], tmp_path_factory.mktemp("plain") / "qwen3")


@pytest.mark.parametrize("settings,unknown", [
    ({"windowsize": 8}, "'windowsize'"),
    ({"entropy_treshold": 0.3}, "'entropy_treshold'"),
    ({"wedlm_window_size": 8, "pos_penality": 0.1}, "'pos_penality', 'wedlm_window_size'"),
])
def test_misspelt_settings_of_wedlm_mode_fail_at_start_up(tiny_checkpoints, settings, unknown):
    with pytest.raises(ValueError, match=f"Unknown additional_config key\\(s\\) {unknown} with decoding 'wedlm'; "
                                         f"the WeDLM settings are {ACCEPTED_SETTINGS}"):
        engine_config(tiny_checkpoints["qwen3"], {"decoding": "wedlm", **settings})


def test_a_non_dict_additional_config_fails_at_start_up_for_a_wedlm_model(tiny_checkpoints):
    with pytest.raises(ValueError, match=f"reads its settings \\({ACCEPTED_SETTINGS}\\) from a dict "
                                         "additional_config; got a PlatformConfig"):
        engine_config(tiny_checkpoints["qwen3"], PlatformConfig())


def test_misspelt_setting_fails_vllm_serve_at_start_up(tiny_checkpoints):
    done = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(tiny_checkpoints["qwen3"]),
                           "--decoding", "wedlm", "--additional-config", '{"windowsize": 8}', "--max-model-len", "256",
                           "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 26)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert f"Unknown additional_config key(s) 'windowsize' with decoding 'wedlm'; the WeDLM settings are " \
           f"{ACCEPTED_SETTINGS}" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


def test_keys_of_others_pass(tiny_checkpoints, plain_qwen):
    # AR mode is vLLM's ordinary path: keys the plugin does not know are someone else's.
    assert engine_config(tiny_checkpoints["qwen3"], {"decoding": "ar", "someone_elses": 1}).additional_config == {
        "decoding": "ar", "someone_elses": 1}
    # vLLM's own key beside the WeDLM settings (--gdn-prefill-backend writes it).
    config = engine_config(tiny_checkpoints["qwen3"], {"decoding": "wedlm"}, gdn_prefill_backend="triton")
    assert config.additional_config == {"decoding": "wedlm", "gdn_prefill_backend": "triton"}
    # Other models: the plugin reads nothing of their additional_config, dict or not.
    assert engine_config(plain_qwen, {"window_size": "not a WeDLM setting"}).additional_config == {
        "window_size": "not a WeDLM setting"}
    assert isinstance(engine_config(plain_qwen, PlatformConfig()).additional_config, PlatformConfig)


def validate(extra_args):
    """vLLM's front end calls this on every request of a WeDLM engine (adapter/request_validator.py)."""
    from vllm import SamplingParams

    from vllm_wedlm.adapter.request_validator import WeDLMRequestValidator

    WeDLMRequestValidator.validate_params(SamplingParams(max_tokens=4, extra_args=extra_args))


@pytest.mark.parametrize("extra_args,unknown", [
    ({"wedlm_window": 4}, "'wedlm_window'"),
    ({"wedlm_entropy_treshold": 0.5, "wedlm_pos_penalty": 0.1}, "'wedlm_entropy_treshold'"),
    ({"wedlm_window_sizes": 4}, "'wedlm_window_sizes'"),
])
def test_misspelt_request_knobs_are_refused(extra_args, unknown):
    with pytest.raises(ValueError, match=f"unknown WeDLM key\\(s\\) {unknown}; per request WeDLM accepts "
                                         f"{ACCEPTED_REQUEST_KEYS}"):
        validate(extra_args)


@pytest.mark.parametrize("server,extra_args,message", [
    ({}, {"wedlm_window_size": 0}, "wedlm_window_size must be in \\[1, 16\\] \\(this server's largest W\\), got 0"),
    ({}, {"wedlm_window_size": 17}, "wedlm_window_size must be in \\[1, 16\\]"),
    ({}, {"wedlm_window_size": "8"}, "wedlm_window_size must be an integer, got '8'"),
    ({}, {"wedlm_window_size": 8.0}, "wedlm_window_size must be an integer"),
    ({}, {"wedlm_window_size": True}, "wedlm_window_size must be an integer"),
    ({}, {"wedlm_window_size": 4, "wedlm_decoding": "ar"}, "wedlm_window_size is for requests decoded in windows"),
    ({"window_size": 8}, {"wedlm_window_size": 4}, "wedlm_window_size 4: this server runs every request at a "
                                                    "fixed W of 8 \\(--wedlm-window-size 8\\)"),
    ({"window_size": 8}, {"wedlm_window_size": 16}, "fixed W of 8"),
])
def test_a_pinned_window_the_server_cannot_run_is_refused(server, extra_args, message):
    """A request pins its W (``wedlm_window_size``) within what the server runs: 1 to its largest W on
    the adaptive window (the default), its one W on a server of a fixed W."""
    from vllm_wedlm.config import WeDLMSettings

    settings = WeDLMSettings.from_additional_config({"decoding": "wedlm", **server})
    with pytest.raises(ValueError, match=message):
        settings.check_request(extra_args)


def test_a_pinned_window_is_read_over_any_other_knob():
    from vllm_wedlm.config import WeDLMSettings

    adaptive = WeDLMSettings.from_additional_config({"decoding": "wedlm"})
    assert [adaptive.pinned_window({"wedlm_window_size": w}) for w in (1, 8, 16)] == [1, 8, 16]
    assert adaptive.pinned_window({"wedlm_window_size": 4, "wedlm_lossless": True}) == 4
    assert adaptive.pinned_window(None) is None
    assert adaptive.pinned_window({"wedlm_entropy_threshold": 0.5}) is None
    fixed = WeDLMSettings.from_additional_config({"decoding": "wedlm", "window_size": 8})
    assert fixed.pinned_window({"wedlm_window_size": 8}) == 8


def test_the_front_end_checks_a_pin_against_the_server_it_built(tiny_checkpoints):
    """vLLM's front end validates a request without the engine's settings: the config hook hands them
    to the validator where it builds the engine's config, so a pin of a W the server does not run is a
    400 before the request reaches the engine."""
    from vllm_wedlm.adapter import request_validator
    from vllm_wedlm.config import WeDLMSettings

    try:
        engine_config(tiny_checkpoints["qwen3"], {"decoding": "wedlm", "window_size": 8})
        with pytest.raises(ValueError, match="Invalid WeDLM setting in extra_args / vllm_xargs: wedlm_window_size 4: "
                                             "this server runs every request at a fixed W of 8"):
            validate({"wedlm_window_size": 4})
        validate({"wedlm_window_size": 8})
        engine_config(tiny_checkpoints["qwen3"], {"decoding": "wedlm"})
        validate({"wedlm_window_size": 4})
        with pytest.raises(ValueError, match="wedlm_window_size must be in \\[1, 16\\]"):
            validate({"wedlm_window_size": 32})
    finally:
        request_validator.serve(WeDLMSettings())


def test_request_keys_of_others_pass():
    validate({"wedlm_entropy_threshold": 0.5, "wedlm_pos_penalty": 0.1, "kv_transfer_params": {}, "other": 1})
    validate(None)


def test_the_lossless_flag_per_request_over_the_server_default():
    from vllm_wedlm.config import WeDLMSettings

    server = WeDLMSettings.from_additional_config({"decoding": "wedlm", "lossless": True})
    assert server.request_params(None).lossless
    assert not server.request_params({"wedlm_lossless": False}).lossless
    # vLLM's OpenAI server turns JSON true / false in vllm_xargs into 1 / 0.
    assert WeDLMSettings().request_params({"wedlm_lossless": 1}).lossless
    assert not server.request_params({"wedlm_lossless": 0}).lossless
    with pytest.raises(ValueError, match="wedlm_lossless must be true or false"):
        validate({"wedlm_lossless": "true"})


def test_one_fill_per_step_is_a_word_where_json_null_cannot_go():
    from vllm_wedlm.config import WeDLMSettings

    settings = WeDLMSettings.from_additional_config({"decoding": "wedlm"})
    assert settings.request_params({}).entropy_threshold == 0.4
    for word in ("none", "None", "NULL", " none "):
        assert settings.request_params({"wedlm_entropy_threshold": word}).entropy_threshold is None
    assert WeDLMSettings.from_additional_config({"decoding": "wedlm", "entropy_threshold": "none"}).params \
        .entropy_threshold is None
    with pytest.raises(ValueError, match="entropy_threshold must be a positive finite number or None"):
        validate({"wedlm_entropy_threshold": "nothing"})


@pytest.mark.parametrize("extra_args", [None, {"wedlm_decoding": "ar"}, {"wedlm_lossless": True}])
def test_logprobs_of_the_whole_vocabulary_are_refused_in_every_mode(extra_args):
    """``logprobs: -1`` (every token's; vLLM takes it where ``--max-logprobs -1`` allows) gets a clear
    error, whatever the request's mode; a number of them passes in every mode (plain, lossless,
    per-request AR)."""
    from vllm import SamplingParams

    from vllm_wedlm.adapter.request_validator import WeDLMRequestValidator

    with pytest.raises(ValueError, match="logprobs -1 \\(the whole vocabulary\\)"):
        WeDLMRequestValidator.validate_params(SamplingParams(max_tokens=4, logprobs=-1, extra_args=extra_args))
    WeDLMRequestValidator.validate_params(SamplingParams(max_tokens=4, logprobs=2, extra_args=extra_args))
