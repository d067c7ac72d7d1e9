"""``--decoding`` on vLLM's real argument parser, and validation of the settings at start-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_wedlm


@pytest.fixture(scope="module")
def serve_parser():
    vllm_wedlm.register()
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


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
