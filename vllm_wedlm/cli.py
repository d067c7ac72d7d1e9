"""The plugin's flags on ``vllm serve`` (and every vLLM command that takes engine args).

vLLM has no hook that hands a plugin its argument parser, but ``AsyncEngineArgs.add_cli_args``
loads the general plugins and only then looks up ``EngineArgs.add_cli_args``, so a wrapper
installed by the plugin adds the flags. ``EngineArgs.from_cli_args`` copies only dataclass
fields, so a second wrapper folds the flags into ``additional_config``, where the engine reads
them; folding there (not in an argparse action) works whatever order the flags and
``--additional-config`` come in. A third wrapper, on ``EngineArgs.create_engine_config`` (used by
``vllm serve`` and ``vllm.LLM`` alike), refuses WeDLM decoding of a model that is not a WeDLM model
and, for a WeDLM engine with statistics on, adds the WeDLM metrics (adapter/metrics.py says why
there).
"""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

from vllm_wedlm.config import (
    AR_STEP_COST_KEY,
    ASYNC_PADDING_KEY,
    AUTO_WINDOW,
    DECODING_KEY,
    DECODING_MODES,
    DEFAULT_DECODING,
    ENTROPY_THRESHOLD_KEY,
    LOSSLESS_KEY,
    OFF,
    POS_PENALTY_KEY,
    WINDOW_SIZE_KEY,
    WINDOW_TOKENS_KEY,
    asks_for_wedlm,
    threshold_value,
)
from vllm_wedlm.core.params import DEFAULT_PARAMS, DEFAULT_WINDOW_SIZE
from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, MODEL_TYPE

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

_MARK = "_vllm_wedlm_wrapped"

# namespace attribute -> additional_config key
_FLAG_KEYS = {
    "wedlm_decoding": DECODING_KEY,
    "wedlm_window_size": WINDOW_SIZE_KEY,
    "wedlm_window_tokens": WINDOW_TOKENS_KEY,
    "wedlm_ar_step_cost": AR_STEP_COST_KEY,
    "wedlm_entropy_threshold": ENTROPY_THRESHOLD_KEY,
    "wedlm_pos_penalty": POS_PENALTY_KEY,
    "wedlm_lossless": LOSSLESS_KEY,
    "wedlm_async_padding_tokens": ASYNC_PADDING_KEY,
}


def _threshold(text: str) -> float | None:
    return None if threshold_value(text) is None else float(text)


def _int_or_auto(text: str) -> int | str:
    return AUTO_WINDOW if text == AUTO_WINDOW else int(text)


def _number_or_word(text: str) -> float | str:
    return text if text in (AUTO_WINDOW, OFF) else float(text)


def add_wedlm_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("WeDLM", "Options of the vllm_wedlm plugin.")
    group.add_argument("--decoding", dest="wedlm_decoding", choices=DECODING_MODES, default=argparse.SUPPRESS,
                       help=f"How a WeDLM model decodes (default: {DEFAULT_DECODING}). 'ar': one token per "
                       "forward, vLLM's ordinary path. 'wedlm': WeDLM's streaming parallel decoding.")
    group.add_argument("--wedlm-window-size", type=_int_or_auto, default=argparse.SUPPRESS,
                       help=f"WeDLM mode: '{AUTO_WINDOW}' (the default): each request's undecided slots (W) "
                       "chosen each step from what its windows commit and what rows cost, at most "
                       f"{DEFAULT_WINDOW_SIZE}; or an integer: that W for every request, whatever the load "
                       "(reproducible output). A request can pin its own W: 'wedlm_window_size'.")
    group.add_argument("--wedlm-window-tokens", type=int, default=argparse.SUPPRESS,
                       help="WeDLM mode, adaptive window: size each request's window each step at most "
                       "--wedlm-window-size (a fixed one otherwise), taking this many "
                       "window rows per step as free (the step-cost model's knee; default 32, where the "
                       "Qwen3-8B shape's steps bend on an H200).")
    group.add_argument("--wedlm-ar-step-cost", type=_number_or_word, default=argparse.SUPPRESS,
                       help="WeDLM mode, adaptive window, synchronous engine: what an AR step of the whole batch "
                       "(W 0, vLLM's own step) costs against a window step of one-slot windows; the window "
                       "falls to W 0 where windows commit too little to pay for their rows (default "
                       f"'{AUTO_WINDOW}': timed by the engine; '{OFF}': never).")
    group.add_argument("--wedlm-entropy-threshold", type=_threshold, default=argparse.SUPPRESS,
                       help=f"WeDLM mode: fill every mask whose adjusted entropy is below this "
                       f"(default {DEFAULT_PARAMS.entropy_threshold}; 'none' = one per step). "
                       "Per request: extra_args / vllm_xargs 'wedlm_entropy_threshold'.")
    group.add_argument("--wedlm-pos-penalty", type=float, default=argparse.SUPPRESS,
                       help=f"WeDLM mode: entropy penalty per slot of distance from the first mask "
                       f"(default {DEFAULT_PARAMS.pos_penalty}). Per request: 'wedlm_pos_penalty'.")
    group.add_argument("--wedlm-lossless", action="store_true", default=argparse.SUPPRESS,
                       help="WeDLM mode: verify every fill against the model's next-token prediction before "
                       "committing it, so the output is exactly --decoding ar's (greedy: token for token; "
                       "sampled: in distribution) at several tokens per forward. Per request: 'wedlm_lossless'.")
    group.add_argument("--wedlm-async-padding-tokens", type=_int_or_auto, default=argparse.SUPPRESS,
                       help="WeDLM mode under async scheduling (a GPU's default): pipeline a step (schedule it "
                       "before the one before it is back, each window padded to 2W rows) only while the padding "
                       "costs at most "
                       f"about this many tokens of forward; otherwise forward exact rows, one step at a time "
                       f"(default '{AUTO_WINDOW}': estimated from the model's size).")


def fold_into_additional_config(args: argparse.Namespace) -> None:
    # The flags default to SUPPRESS: an attribute exists only for a flag on the command line
    # (so "--wedlm-entropy-threshold none" is told apart from no flag).
    given = {key: getattr(args, attr) for attr, key in _FLAG_KEYS.items() if hasattr(args, attr)}
    if given:
        args.additional_config = {**(getattr(args, "additional_config", None) or {}), **given}


def check_engine_config(vllm_config: VllmConfig) -> None:
    """Refuse WeDLM decoding of a model that is not a WeDLM model, with the reason.

    A WeDLM model's settings are read and checked by its config hook (adapter/config_hook.py).
    For any other model the plugin looks at nothing but ``decoding == "wedlm"``: the rest of
    ``additional_config`` belongs to vLLM and other plugins.
    """
    model_config = vllm_config.model_config
    if model_config is None or model_config.architecture == ARCHITECTURE:
        return
    if asks_for_wedlm(vllm_config.additional_config):
        raise ValueError(
            f"--decoding wedlm needs a WeDLM model (architecture {ARCHITECTURE}, model_type "
            f"{MODEL_TYPE!r}); {model_config.model} is {model_config.architecture}. Use --decoding ar."
        )


def install_cli_flags() -> None:
    from vllm.engine.arg_utils import EngineArgs

    if getattr(EngineArgs.add_cli_args, _MARK, False):
        return
    original_add = EngineArgs.add_cli_args
    original_from = EngineArgs.from_cli_args.__func__
    original_create = EngineArgs.create_engine_config

    @functools.wraps(original_add)
    def add_cli_args(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
        parser = original_add(parser)
        add_wedlm_args(parser)
        return parser

    @functools.wraps(original_from)
    def from_cli_args(cls: type[EngineArgs], args: argparse.Namespace) -> EngineArgs:
        fold_into_additional_config(args)
        return original_from(cls, args)

    @functools.wraps(original_create)
    def create_engine_config(self: EngineArgs, *args: Any, **kwargs: Any) -> VllmConfig:
        vllm_config = original_create(self, *args, **kwargs)
        check_engine_config(vllm_config)
        if asks_for_wedlm(vllm_config.additional_config) and not self.disable_log_stats:
            # WeDLM's counters in /metrics; only now, so AR engines keep vLLM's own stat loggers.
            from vllm_wedlm.adapter.metrics import use_for_wedlm_engines

            use_for_wedlm_engines()
        return vllm_config

    setattr(add_cli_args, _MARK, True)
    EngineArgs.add_cli_args = staticmethod(add_cli_args)
    EngineArgs.from_cli_args = classmethod(from_cli_args)
    EngineArgs.create_engine_config = create_engine_config
