"""The plugin's user-facing settings, carried in vLLM's ``additional_config``.

``vllm serve MODEL --decoding wedlm --wedlm-window-size 16`` and
``LLM(MODEL, additional_config={"decoding": "wedlm", "window_size": 16})`` both end up here.
Keeping the settings in ``additional_config`` puts them in vLLM's config hash and ships them to
every engine process without any side channel. Per-request overrides of the two selection knobs
come through ``SamplingParams.extra_args`` (OpenAI: ``vllm_xargs``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm_wedlm.core.params import (
    DEFAULT_PARAMS,
    DEFAULT_WINDOW_SIZE,
    WeDLMParams,
    validate_window_size,
    validate_window_tokens,
)

#: Decoding modes. "ar": one token per forward, vLLM's ordinary path. "wedlm": WeDLM's streaming
#: parallel decoding of a window of masked slots per forward.
DECODING_MODES = ("ar", "wedlm")
DEFAULT_DECODING = "ar"

#: additional_config keys (server-wide settings).
DECODING_KEY = "decoding"
#: W, server-wide. Absent or "auto" (the default): the adaptive window (``core/window_policy.py``: each
#: request's W per step from what its windows commit and what rows cost, at most the default W); an
#: integer: that fixed W for every request (reproducible output whatever the load).
WINDOW_SIZE_KEY = "window_size"
#: The knee of the adaptive window's step-cost model: the window rows a step takes at no extra cost
#: (default: adapter/async_gate.WINDOW_KNEE_TOKENS). With it, ``window_size`` is the most W of an
#: adaptive window, not a fixed W.
WINDOW_TOKENS_KEY = "window_tokens"
AUTO_WINDOW = "auto"
#: With the adaptive window on the synchronous engine: what an AR step (W 0 for the whole batch, vLLM's
#: own step) costs against a window step of one-slot windows. "auto" (the default): timed by the
#: engine; a positive number: that fraction, fixed; "off": no AR steps.
AR_STEP_COST_KEY = "ar_step_cost"
OFF = "off"
ENTROPY_THRESHOLD_KEY = "entropy_threshold"
POS_PENALTY_KEY = "pos_penalty"
LOSSLESS_KEY = "lossless"
#: true: every window forwards a fixed 2W rows laid out on the device from the last step's result,
#: so a step is scheduled without waiting for the one before (what async scheduling needs; the
#: config hook turns it on with async scheduling on a GPU). Every mode runs on it.
FIXED_ROWS_KEY = "fixed_window_rows"
#: With fixed window rows: a step is scheduled before the one before it is back (pipelined) only
#: while padding its windows to 2W rows costs at most about this many tokens of forward; otherwise
#: it waits for that step and forwards each window's exact rows. "auto" (the default): estimated
#: from the model's size with async scheduling (``adapter/async_gate.py``), 0 without.
ASYNC_PADDING_KEY = "async_padding_tokens"
SETTINGS_KEYS = (DECODING_KEY, WINDOW_SIZE_KEY, WINDOW_TOKENS_KEY, AR_STEP_COST_KEY, ENTROPY_THRESHOLD_KEY,
                 POS_PENALTY_KEY, LOSSLESS_KEY, FIXED_ROWS_KEY, ASYNC_PADDING_KEY)

#: additional_config keys that vLLM 0.26.0 writes itself (``EngineArgs.create_engine_config`` stores
#: ``--gdn-prefill-backend`` there); allowed beside the WeDLM settings.
VLLM_KEYS = ("gdn_prefill_backend",)

#: SamplingParams.extra_args keys (per-request overrides). extra_args is shared with other plugins
#: and logits processors, so WeDLM's keys carry a prefix: a key with the prefix must be one of
#: REQUEST_KEYS, a key without it is someone else's and left alone.
REQUEST_KEY_PREFIX = "wedlm_"
REQUEST_ENTROPY_THRESHOLD = "wedlm_entropy_threshold"
REQUEST_POS_PENALTY = "wedlm_pos_penalty"
#: true: the request's fills are verified against the model's next-token prediction, so its output
#: is exactly AR decoding's on the same weights (WeDLMParams.lossless).
REQUEST_LOSSLESS = "wedlm_lossless"
#: "ar" decodes this request one token per forward on a WeDLM engine (same weights, same batches);
#: "wedlm" (the default there) with the WeDLM window. An AR engine has no WeDLM requests.
REQUEST_DECODING = "wedlm_decoding"
#: An integer W in [1, the server's W]: the request's window is never resized (the adaptive window
#: leaves it alone), so its tokens depend only on its prompt and settings, not on its batch mates or
#: the engine's timing: for evaluations. On a server of a fixed W it can only be that W.
REQUEST_WINDOW_SIZE = "wedlm_window_size"
#: What asks for one fill per step (``entropy_threshold`` None) where a value must be a word:
#: ``--wedlm-entropy-threshold none``, and ``vllm_xargs`` over HTTP, where vLLM refuses JSON null.
NO_THRESHOLD_WORDS = ("none", "null")
REQUEST_KEYS = (REQUEST_DECODING, REQUEST_ENTROPY_THRESHOLD, REQUEST_POS_PENALTY, REQUEST_LOSSLESS,
                REQUEST_WINDOW_SIZE)


def max_window_tokens(window_size: int) -> int:
    """The most tokens one request forwards in a WeDLM step: its ``window_size`` undecided slots and
    at most as many filled ones (each was an undecided slot once). A step's token budget must hold
    this for every running request."""
    return 2 * window_size


def asks_for_wedlm(additional_config: object) -> bool:
    """Whether an engine's ``additional_config`` selects WeDLM decoding (a look, no validation)."""
    return isinstance(additional_config, dict) and additional_config.get(DECODING_KEY) == "wedlm"


def _names(keys: Iterable[object]) -> str:
    return ", ".join(repr(key) for key in sorted(keys, key=str))


@dataclass(frozen=True)
class WeDLMSettings:
    """Validated plugin settings of one engine."""

    decoding: str = DEFAULT_DECODING
    """How to decode: "ar" or "wedlm"."""

    window_size: int = DEFAULT_WINDOW_SIZE
    """W: undecided slots kept per request (WeDLM mode); each forward covers W to
    ``max_window_tokens(W)`` tokens. With ``adaptive_window``, the largest W a request may get."""

    adaptive_window: bool = True
    """Each request's W chosen per step (``core/window_policy.py``, by the scheduler; the default),
    but for requests that pin their own (``REQUEST_WINDOW_SIZE``); else always ``window_size``
    (``window_size`` given as an integer)."""

    window_tokens: int | None = None
    """The adaptive window's knee: rows a step takes at no extra cost (None: ``WINDOW_KNEE_TOKENS``)."""

    ar_steps: bool = True
    """The adaptive window may choose W 0, an AR step of the batch (``AR_STEP_COST_KEY`` not "off")."""

    ar_step_cost: float | None = None
    """An AR step's cost against a window step's of one-slot windows (None: timed by the engine)."""

    params: WeDLMParams = field(default_factory=lambda: DEFAULT_PARAMS)
    """Server defaults of the per-request knobs (tau, lambda, lossless)."""

    fixed_window_rows: bool = False
    """Windows forward up to 2W rows laid out on the device (``FIXED_ROWS_KEY``)."""

    async_padding_tokens: int | None = None
    """``ASYNC_PADDING_KEY``; None: "auto"."""

    @property
    def wedlm(self) -> bool:
        return self.decoding == "wedlm"

    @classmethod
    def from_additional_config(cls, additional_config: object) -> WeDLMSettings:
        """Read and validate the settings of an engine that runs a WeDLM model; raise
        ``ValueError`` saying what to fix.

        ``additional_config`` is shared: vLLM documents it as the platform's settings, stores
        ``gdn_prefill_backend`` in it, and other plugins may read it. So which keys are the plugin's
        depends on the mode. AR mode (no ``decoding`` key, or ``"ar"``) is vLLM's ordinary path:
        the plugin checks the values of its own keys and leaves every other key to its owner.
        WeDLM mode runs only on vLLM's CPU and CUDA platforms, which read nothing from
        ``additional_config`` (adapter/config_hook.py refuses the others), so there every key must
        be a WeDLM setting or one of vLLM's own: anything else is a misspelt setting
        (``windowsize``) that would otherwise be ignored while its default silently applies.
        """
        if not isinstance(additional_config, dict):
            # vLLM also accepts a platform's own config object here; it cannot hold WeDLM settings.
            raise ValueError(
                f"A WeDLM model reads its settings ({_names(SETTINGS_KEYS)}) from a dict additional_config; "
                f"got a {type(additional_config).__name__}."
            )
        decoding = additional_config.get(DECODING_KEY, DEFAULT_DECODING)
        if decoding not in DECODING_MODES:
            raise ValueError(
                f"Unknown decoding mode {decoding!r} (additional_config[{DECODING_KEY!r}]); "
                f"choose one of {', '.join(DECODING_MODES)}."
            )
        if decoding == "wedlm":
            unknown = set(additional_config) - set(SETTINGS_KEYS) - set(VLLM_KEYS)
            if unknown:
                raise ValueError(
                    f"Unknown additional_config key(s) {_names(unknown)} with decoding 'wedlm'; the WeDLM "
                    f"settings are {_names(SETTINGS_KEYS)} (flags --decoding, --wedlm-window-size, "
                    "--wedlm-window-tokens, --wedlm-ar-step-cost, --wedlm-entropy-threshold, --wedlm-pos-penalty, "
                    "--wedlm-lossless, --wedlm-async-padding-tokens)."
                )
        window_size = additional_config.get(WINDOW_SIZE_KEY, AUTO_WINDOW)
        window_tokens = additional_config.get(WINDOW_TOKENS_KEY)
        adaptive_window = window_size == AUTO_WINDOW or window_tokens is not None
        if window_size == AUTO_WINDOW:
            window_size = DEFAULT_WINDOW_SIZE
        elif isinstance(window_size, str):
            raise ValueError(f"window_size must be an integer in [1, 256] or {AUTO_WINDOW!r}, got {window_size!r}")
        window_size = validate_window_size(window_size)
        window_tokens = None if window_tokens is None else validate_window_tokens(window_tokens)
        ar_step_cost = additional_config.get(AR_STEP_COST_KEY, AUTO_WINDOW)
        if ar_step_cost not in (AUTO_WINDOW, OFF) and (isinstance(ar_step_cost, bool)
                                                      or not isinstance(ar_step_cost, int | float)
                                                      or not 0 < ar_step_cost <= 100):
            raise ValueError(f"{AR_STEP_COST_KEY} must be a number in (0, 100], {AUTO_WINDOW!r} or {OFF!r}, "
                             f"got {ar_step_cost!r}")
        if AR_STEP_COST_KEY in additional_config and not adaptive_window:
            raise ValueError(f"{AR_STEP_COST_KEY} (--wedlm-ar-step-cost) applies to the adaptive window only "
                             f"(the default; a fixed --wedlm-window-size {window_size} turns it off)")
        params = WeDLMParams(
            entropy_threshold=threshold_value(additional_config.get(ENTROPY_THRESHOLD_KEY,
                                                                    DEFAULT_PARAMS.entropy_threshold)),
            pos_penalty=additional_config.get(POS_PENALTY_KEY, DEFAULT_PARAMS.pos_penalty),
            lossless=additional_config.get(LOSSLESS_KEY, DEFAULT_PARAMS.lossless),
        )
        fixed_window_rows = additional_config.get(FIXED_ROWS_KEY, False)
        if not isinstance(fixed_window_rows, bool):
            raise ValueError(f"{FIXED_ROWS_KEY} must be true or false, got {fixed_window_rows!r}")
        padding = additional_config.get(ASYNC_PADDING_KEY, AUTO_WINDOW)
        if padding == AUTO_WINDOW:
            padding = None
        elif isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"{ASYNC_PADDING_KEY} must be a non-negative integer or {AUTO_WINDOW!r}, got {padding!r}")
        return cls(decoding=decoding, window_size=window_size, adaptive_window=adaptive_window,
                   window_tokens=window_tokens, ar_steps=ar_step_cost != OFF,
                   ar_step_cost=None if ar_step_cost in (AUTO_WINDOW, OFF) else float(ar_step_cost), params=params,
                   fixed_window_rows=fixed_window_rows, async_padding_tokens=padding)

    def with_fixed_window_rows(self, additional_config: dict) -> WeDLMSettings:
        """These settings with fixed window rows, also written into ``additional_config`` (which the
        engine's processes read); ``ValueError`` where the settings do not allow them."""
        config = {**additional_config, FIXED_ROWS_KEY: True}
        settings = WeDLMSettings.from_additional_config(config)
        additional_config[FIXED_ROWS_KEY] = True
        return settings

    def check_request(self, extra_args: dict | None) -> None:
        """``ValueError`` for any WeDLM key of a request this server does not take: a knob
        ``request_params`` refuses, or a pin it cannot run (``pinned_window``). The front end's check."""
        self.request_params(extra_args)
        self.pinned_window(extra_args)

    def request_params(self, extra_args: dict | None) -> WeDLMParams:
        """The knobs of one request: its extra_args over the server defaults.

        A ``wedlm_`` key that is not a knob (``wedlm_window``, ``wedlm_entropy_treshold``) is an
        error, not a silent default; keys without the prefix belong to others. (A pinned W is not
        a knob of the window's selection: ``pinned_window`` reads it.)
        """
        if not extra_args:
            return self.params
        unknown = [k for k in extra_args if str(k).startswith(REQUEST_KEY_PREFIX) and k not in REQUEST_KEYS]
        if unknown:
            raise ValueError(
                f"unknown WeDLM key(s) {_names(unknown)}; per request WeDLM accepts {_names(REQUEST_KEYS)}"
            )
        request_decoding(extra_args)
        return WeDLMParams(
            entropy_threshold=threshold_value(extra_args.get(REQUEST_ENTROPY_THRESHOLD, self.params.entropy_threshold)),
            pos_penalty=extra_args.get(REQUEST_POS_PENALTY, self.params.pos_penalty),
            lossless=request_flag(extra_args, REQUEST_LOSSLESS, self.params.lossless),
        )


    def pinned_window(self, extra_args: dict | None) -> int | None:
        """The W a request pins its window to (``REQUEST_WINDOW_SIZE``), None where it pins none;
        ``ValueError`` for one this server cannot run."""
        value = (extra_args or {}).get(REQUEST_WINDOW_SIZE)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{REQUEST_WINDOW_SIZE} must be an integer, got {value!r}")
        if request_decoding(extra_args) == "ar":
            raise ValueError(f"{REQUEST_WINDOW_SIZE} is for requests decoded in windows, not with "
                             f"{REQUEST_DECODING} 'ar'")
        if not self.adaptive_window:
            if value != self.window_size:
                raise ValueError(f"{REQUEST_WINDOW_SIZE} {value}: this server runs every request at a fixed W of "
                                 f"{self.window_size} (--wedlm-window-size {self.window_size}); a request can pin "
                                 "another W on a server of the adaptive window (no --wedlm-window-size)")
        elif not 1 <= value <= self.window_size:
            raise ValueError(f"{REQUEST_WINDOW_SIZE} must be in [1, {self.window_size}] (this server's largest W), "
                             f"got {value}")
        return value


def threshold_value(value):
    """An entropy threshold as given, with a word of ``NO_THRESHOLD_WORDS`` (any case) read as None
    (one fill per step); ``WeDLMParams`` checks the rest."""
    if isinstance(value, str) and value.strip().lower() in NO_THRESHOLD_WORDS:
        return None
    return value


def request_flag(extra_args: dict, key: str, default: bool) -> bool:
    """A true/false knob of a request. vLLM's OpenAI server types ``vllm_xargs`` values as str, int,
    float or lists of them, so JSON ``true`` arrives as 1: 1 and 0 are accepted beside booleans."""
    value = extra_args.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{key} must be true or false (or 1 / 0), got {value!r}")


def decodes_ar(sampling_params) -> bool:
    """Whether a request on a WeDLM engine is decoded AR, one token per step: it asks for it
    (``wedlm_decoding: "ar"``), or for a ``thinking_token_budget``. Any other, structured outputs
    included, plain or lossless, decodes in windows (``adapter/grammar_rows.py``)."""
    extra_args = sampling_params.extra_args if sampling_params is not None else None
    if request_decoding(extra_args) == "ar":
        return True
    # vLLM's budget state follows one token per step (adapter/row_layout.py)
    return sampling_params is not None and sampling_params.thinking_token_budget is not None


def request_decoding(extra_args: dict | None) -> str:
    """How a request on a WeDLM engine is decoded: ``extra_args["wedlm_decoding"]``, default "wedlm"."""
    mode = (extra_args or {}).get(REQUEST_DECODING, "wedlm")
    if mode not in DECODING_MODES:
        raise ValueError(f"{REQUEST_DECODING} must be one of {_names(DECODING_MODES)}, got {mode!r}")
    return mode
