"""The ``--decoding`` flag of ``vllm serve`` (and every vLLM command that takes engine args).

vLLM has no hook that hands a plugin its argument parser, but ``AsyncEngineArgs.add_cli_args``
loads the general plugins and only then looks up ``EngineArgs.add_cli_args``, so a wrapper
installed by the plugin adds the flag. ``EngineArgs.from_cli_args`` copies only dataclass fields,
so a second wrapper folds the flag into ``additional_config``, where the engine reads it. Folding
it there (rather than in an argparse action) keeps it whatever order ``--decoding`` and
``--additional-config`` come in.
"""

from __future__ import annotations

import argparse

from vllm_wedlm.config import DECODING_KEY, DECODING_MODES, DEFAULT_DECODING

_ATTR = "wedlm_decoding"  # namespace attribute of the parsed flag
_MARK = "_vllm_wedlm_wrapped"


def add_wedlm_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("WeDLM", "Options of the vllm_wedlm plugin.")
    group.add_argument(
        "--decoding",
        dest=_ATTR,
        choices=DECODING_MODES,
        default=None,
        help=f"How a WeDLM model decodes (default: {DEFAULT_DECODING}). "
        "'ar': one token per forward, vLLM's ordinary path.",
    )


def fold_into_additional_config(args: argparse.Namespace) -> None:
    decoding = getattr(args, _ATTR, None)
    if decoding is None:
        return
    additional = dict(getattr(args, "additional_config", None) or {})
    additional[DECODING_KEY] = decoding
    args.additional_config = additional


def install_cli_flags() -> None:
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs.add_cli_args, _MARK, False):
        return
    original_add = EngineArgs.add_cli_args
    original_from = EngineArgs.from_cli_args.__func__

    def add_cli_args(parser):
        parser = original_add(parser)
        add_wedlm_args(parser)
        return parser

    def from_cli_args(cls, args: argparse.Namespace):
        fold_into_additional_config(args)
        return original_from(cls, args)

    setattr(add_cli_args, _MARK, True)
    EngineArgs.add_cli_args = staticmethod(add_cli_args)
    EngineArgs.from_cli_args = classmethod(from_cli_args)
