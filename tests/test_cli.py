"""``--decoding`` on vLLM's real argument parser, and validation of the settings at start-up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import vllm_wedlm
from vllm_wedlm.config import WeDLMSettings


@pytest.fixture(scope="module")
def serve_parser(tmp_path_factory):
    vllm_wedlm.register()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    # A local model directory: vLLM resolves a hub name at EngineArgs construction, which an
    # offline machine (HF_HUB_OFFLINE, as on the GPU machine) refuses without a cached snapshot.
    parser.set_defaults(model=str(tmp_path_factory.mktemp("local-model")))
    return parser


def engine_args(parser, argv):
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(parser.parse_args(argv))


def test_decoding_flag_lands_in_additional_config(serve_parser):
    assert engine_args(serve_parser, ["--decoding", "ar"]).additional_config == {"decoding": "ar"}


def test_no_flag_changes_nothing(serve_parser):
    assert engine_args(serve_parser, []).additional_config == {}


@pytest.mark.parametrize("argv", [
    ["--decoding", "ar", "--additional-config", '{"other": 1}'],
    ["--additional-config", '{"other": 1}', "--decoding", "ar"],
])
def test_flag_merges_with_additional_config_in_any_order(serve_parser, argv):
    assert engine_args(serve_parser, argv).additional_config == {"other": 1, "decoding": "ar"}


def test_unknown_mode_is_refused_by_vllm_serve():
    done = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "some-model",
                           "--decoding", "bogus"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "--decoding: invalid choice: 'bogus'" in done.stderr


def test_unknown_mode_in_additional_config_is_refused_at_start_up(tiny_checkpoints):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(tiny_checkpoints["qwen3"]), max_model_len=256, enforce_eager=True,
                      kv_cache_memory_bytes=1 << 26, additional_config={"decoding": "bogus"})
    with pytest.raises(ValueError, match="Unknown decoding mode 'bogus'.*choose one of ar"):
        args.create_engine_config()


def test_wedlm_flags_land_in_additional_config(serve_parser):
    argv = ["--decoding", "wedlm", "--wedlm-window-size", "8", "--wedlm-entropy-threshold", "none",
            "--wedlm-pos-penalty", "0.1", "--wedlm-lossless"]
    assert engine_args(serve_parser, argv).additional_config == {
        "decoding": "wedlm", "window_size": 8, "entropy_threshold": None, "pos_penalty": 0.1, "lossless": True}
    argv = ["--decoding", "wedlm", "--wedlm-entropy-threshold", "0.6"]
    assert engine_args(serve_parser, argv).additional_config == {"decoding": "wedlm", "entropy_threshold": 0.6}
    argv = ["--decoding", "wedlm", "--wedlm-async-padding-tokens", "64"]
    assert engine_args(serve_parser, argv).additional_config == {"decoding": "wedlm", "async_padding_tokens": 64}
    argv = ["--decoding", "wedlm", "--wedlm-window-size", "auto"]
    assert engine_args(serve_parser, argv).additional_config == {"decoding": "wedlm", "window_size": "auto"}
    argv = ["--decoding", "wedlm", "--wedlm-window-size", "32", "--wedlm-window-tokens", "128"]
    assert engine_args(serve_parser, argv).additional_config == {"decoding": "wedlm", "window_size": 32,
                                                                 "window_tokens": 128}
    for value, expected in (("0.5", 0.5), ("off", "off"), ("auto", "auto")):
        argv = ["--decoding", "wedlm", "--wedlm-window-size", "auto", "--wedlm-ar-step-cost", value]
        assert engine_args(serve_parser, argv).additional_config == {"decoding": "wedlm", "window_size": "auto",
                                                                     "ar_step_cost": expected}


@pytest.mark.parametrize("config,window_size,adaptive,window_tokens", [
    ({}, 16, True, None),
    ({"window_size": 16}, 16, False, None),
    ({"window_size": 8}, 8, False, None),
    ({"window_size": "auto"}, 16, True, None),
    ({"window_size": "auto", "window_tokens": 64}, 16, True, 64),
    ({"window_size": 32, "window_tokens": 128}, 32, True, 128),
    ({"window_tokens": 128}, 16, True, 128),
])
def test_the_adaptive_window_settings(config, window_size, adaptive, window_tokens):
    """The adaptive window is the default ("auto", or no window_size): W per request and step, at most
    16 (core/window_policy.py; the scheduler chooses it), or with a knee (window_tokens) at most
    window_size; the knee defaults to the model's. An integer window_size alone is a fixed W."""
    settings = WeDLMSettings.from_additional_config({"decoding": "wedlm", **config})
    assert (settings.window_size, settings.adaptive_window, settings.window_tokens) == (
        window_size, adaptive, window_tokens)



@pytest.mark.parametrize("value,ar_steps,cost", [(None, True, None), ("auto", True, None), ("off", False, None),
                                                 (0.5, True, 0.5), (2, True, 2.0)])
def test_the_ar_step_settings(value, ar_steps, cost):
    """The adaptive window may step AR (W 0) unless "off"; its cost against a window step's is timed
    ("auto", the default) or fixed."""
    config = {"decoding": "wedlm", "window_size": "auto"} | ({} if value is None else {"ar_step_cost": value})
    settings = WeDLMSettings.from_additional_config(config)
    assert (settings.ar_steps, settings.ar_step_cost) == (ar_steps, cost)


@pytest.mark.parametrize("settings,message", [
    ({"window_size": 0}, "window_size must be an integer in"),
    ({"window_size": 1000}, "window_size must be an integer in"),
    ({"window_size": "automatic"}, "window_size must be an integer in \\[1, 256\\] or 'auto'"),
    ({"window_tokens": 0}, "window_tokens must be an integer in"),
    ({"window_size": "auto", "window_tokens": 2.5}, "window_tokens must be an integer in"),
    ({"entropy_threshold": -0.5}, "entropy_threshold must be a positive"),
    ({"pos_penalty": -1}, "pos_penalty must be a finite number"),
    ({"lossless": "yes"}, "lossless must be true or false"),
    ({"window_size": "auto", "ar_step_cost": 0}, "ar_step_cost must be a number in \\(0, 100\\], 'auto' or 'off'"),
    ({"window_size": "auto", "ar_step_cost": True}, "ar_step_cost must be a number in"),
    ({"window_size": "auto", "ar_step_cost": "never"}, "ar_step_cost must be a number in"),
    ({"window_size": 16, "ar_step_cost": 0.5}, "ar_step_cost \\(--wedlm-ar-step-cost\\) applies to the adaptive "
                                               "window only \\(the default; a fixed --wedlm-window-size 16"),
    ({"async_padding_tokens": -1}, "async_padding_tokens must be a non-negative integer or 'auto'"),
    ({"async_padding_tokens": "some"}, "async_padding_tokens must be a non-negative integer or 'auto'"),
    # Without async scheduling (always so on the CPU) nothing is pipelined: the knob has no use.
    ({"async_padding_tokens": 64}, "async_padding_tokens \\(--wedlm-async-padding-tokens\\) applies to async "
                                   "scheduling only"),
])
def test_invalid_server_knobs_are_refused_at_start_up(tiny_checkpoints, settings, message):
    from vllm.engine.arg_utils import EngineArgs

    # --no-async-scheduling: on a GPU async scheduling is the default, where the padding knob is valid.
    args = EngineArgs(model=str(tiny_checkpoints["qwen3"]), max_model_len=256, enforce_eager=True,
                      kv_cache_memory_bytes=1 << 26, additional_config={"decoding": "wedlm", **settings},
                      async_scheduling=False)
    with pytest.raises(ValueError, match=message):
        args.create_engine_config()


def test_wedlm_mode_installs_the_plugin_pieces(tiny_checkpoints):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_wedlm.adapter.config_hook import FIXED_ROWS_SCHEDULER_CLS, SCHEDULER_CLS, WORKER_CLS
    from vllm_wedlm.engine_settings import on_gpu

    def wedlm_config(**flags):
        return EngineArgs(model=str(tiny_checkpoints["qwen3"]), max_model_len=256, enforce_eager=True,
                          kv_cache_memory_bytes=1 << 26, additional_config={"decoding": "wedlm", "window_size": 16},
                          **flags).create_engine_config()

    config = wedlm_config()
    # A tiny model's forward hides no host work: synchronous by default on either platform, each
    # window forwarding its exact rows (a large model gets async scheduling on a GPU:
    # test_fixed_window_rows.py checks the rule). So does --no-async-scheduling.
    for engine in (config, wedlm_config(async_scheduling=False)):
        assert engine.scheduler_config.scheduler_cls == SCHEDULER_CLS
        assert engine.scheduler_config.async_scheduling is False
    # --async-scheduling: fixed window rows, pipelined on a GPU (the CPU platform turns async off).
    forced = wedlm_config(async_scheduling=True)
    assert forced.scheduler_config.scheduler_cls == (FIXED_ROWS_SCHEDULER_CLS if on_gpu() else SCHEDULER_CLS)
    assert forced.scheduler_config.async_scheduling is on_gpu()
    # The worker of this machine's platform: CPU here and in CI, CUDA on a GPU machine.
    assert config.parallel_config.worker_cls == WORKER_CLS["cuda" if on_gpu() else "cpu"]
    assert config.parallel_config.worker_cls.endswith("GPUWorker" if on_gpu() else "CPUWorker")
    assert config.scheduler_config.max_num_seqs * 32 <= config.scheduler_config.max_num_batched_tokens
    # The V1 runner, chosen by vLLM itself for an engine with a custom logits processor: no
    # process-wide switch is set, which would change the runner of later engines of this process.
    assert not config.use_v2_model_runner
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    # AR mode installs nothing.
    ar = EngineArgs(model=str(tiny_checkpoints["qwen3"]), max_model_len=256, enforce_eager=True,
                    kv_cache_memory_bytes=1 << 26).create_engine_config()
    assert ar.scheduler_config.scheduler_cls != config.scheduler_config.scheduler_cls
    assert not str(ar.parallel_config.worker_cls).startswith("vllm_wedlm")
