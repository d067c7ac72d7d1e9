"""What the WeDLM scheduler and runner agree on: the one module besides ``core/`` that both import.

* **A request's record** (``classify``): its kind (AR, plain or lossless WeDLM), its WeDLM knobs,
  its pinned W and what its rows need, read once from its ``SamplingParams`` and the server's
  settings in each process that holds it (the scheduler's, the runner's), never parsed again.
* **A step's plan** (``WeDLMStepPlan``): what the scheduler decided for the step beyond vLLM's own
  fields (each window's W, the windows riding with a prompt, the rows of the fixed-rows layout). It
  travels as one value, in a ``SchedulerOutput`` subclass (``WeDLMSchedulerOutput``) that the
  scheduler returns in place of vLLM's, so the runner reads it from its input and the scheduler
  from the output it is handed back: nothing is set on vLLM's objects, nothing is keyed by ``id()``.
* **A step's result** (``WeDLMRunnerOutput``): vLLM's runner output, plus what the scheduler needs
  of the windows (the next windows and the runs not forwarded yet on exact rows, the windows' spans
  on fixed rows), pickled to the scheduler with the rest.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput

from vllm_wedlm.adapter.context_edits import ContextEdits
from vllm_wedlm.config import WeDLMSettings, decodes_ar
from vllm_wedlm.core.logit_edits import LogitEdits
from vllm_wedlm.core.params import WeDLMParams


class RequestKind(enum.Enum):
    AR = "ar"  # one token a step, drawn from its last row (``config.decodes_ar``)
    PLAIN = "plain"  # WeDLM windows
    LOSSLESS = "lossless"  # WeDLM windows whose fills are verified against the AR rows


@dataclass(frozen=True)
class RequestRecord:
    """One request on a WeDLM engine, as ``classify`` read it."""

    kind: RequestKind
    params: WeDLMParams  # its knobs over the server's (the server's own for an AR request)
    # The W it pins (``config.REQUEST_WINDOW_SIZE``) on a server of the adaptive window, else None.
    pinned_window: int | None = None
    # Why a pin was not taken as asked (one the front end let through, run at the server's most), or None.
    pin_error: str | None = None
    edits: LogitEdits | None = None  # allowed_token_ids, logit_bias, min_tokens: on each of its logits rows
    context_edits: ContextEdits | None = None  # penalties and bad words, which read the tokens before a row
    min_p: float = 0.0
    logprobs: bool = False  # asks for the log-probs of its tokens
    logprob_token_ids: tuple[int, ...] | None = None  # ... of these token ids rather than the top K
    grammar: bool = False  # structured outputs (decoded in windows unless the request is AR)

    @property
    def windowed(self) -> bool:
        """Decoded in WeDLM windows (plain or lossless)."""
        return self.kind is not RequestKind.AR

    @property
    def zero_eligible(self) -> bool:
        """Whether its windows may take W 0 (one AR row, drawn apart from the window step): a plain
        request that asks for nothing the runner applies per row or records per fill, which the W 0
        draw does not: log-probs, a grammar, logit and context edits."""
        return (self.kind is RequestKind.PLAIN and not self.logprobs and not self.grammar
                and self.edits is None and self.context_edits is None)


def classify(sampling_params, settings: WeDLMSettings) -> RequestRecord:
    """The record of a request with ``sampling_params`` (vLLM's ``SamplingParams``, or None) on an
    engine of ``settings``. The front end refused invalid knobs (``request_validator``); a pin it let
    through without this server's settings (one of several API servers) runs at the server's most W."""
    params = sampling_params
    shared = {}
    if params is not None:
        shared = dict(edits=LogitEdits.of(params.allowed_token_ids, params.logit_bias, params.min_tokens,
                                          params.all_stop_token_ids),
                      context_edits=ContextEdits.of(params), min_p=params.min_p,
                      logprobs=params.logprobs is not None or bool(params.logprob_token_ids),
                      logprob_token_ids=tuple(params.logprob_token_ids or ()) or None,
                      grammar=params.structured_outputs is not None)
    if decodes_ar(params):
        return RequestRecord(RequestKind.AR, settings.params, **shared)
    extra_args = params.extra_args if params is not None else None
    knobs = settings.request_params(extra_args)
    pinned, pin_error = None, None
    try:
        pinned = settings.pinned_window(extra_args)
    except ValueError as error:
        pinned, pin_error = settings.window_size, str(error)
    if not settings.adaptive_window:
        pinned = None  # every window has the server's W
    kind = RequestKind.LOSSLESS if knobs.lossless else RequestKind.PLAIN
    return RequestRecord(kind, knobs, pinned, pin_error, **shared)


@dataclass(frozen=True)
class WeDLMStepPlan:
    """What the scheduler decided for one step, beyond vLLM's fields. Request ids key each map."""

    # The adaptive window: the W of each window the step plans (0: an AR step's draw, or a window of
    # W 0 on fixed rows); empty at a fixed W, where every window has the server's.
    window_sizes: dict[str, int] = field(default_factory=dict)
    # ... and the W of each window the step forwards (planned by the request's step before).
    forwarded_sizes: dict[str, int] = field(default_factory=dict)
    # The first windows riding with a prompt's last rows (``_ride_first_windows``): their slots.
    first_windows: dict[str, int] = field(default_factory=dict)
    # Fixed rows: the most slots after a plain window's leading run in the step (the logits rows of
    # a window), whether the padding gate padded the step's windows, and the windows of W 0 drawn
    # from a re-prefill's last row. None / None / empty on exact rows.
    mask_rows: int | None = None
    padded: bool | None = None
    redrawn: tuple[str, ...] = ()


EMPTY_PLAN = WeDLMStepPlan()


@dataclass
class WeDLMSchedulerOutput(SchedulerOutput):
    """vLLM's ``SchedulerOutput`` with the step's ``WeDLMStepPlan``."""

    wedlm_plan: WeDLMStepPlan = EMPTY_PLAN

    @classmethod
    def of(cls, scheduler_output: SchedulerOutput, plan: WeDLMStepPlan) -> WeDLMSchedulerOutput:
        """``scheduler_output``'s fields (the same objects, shared) with ``plan``."""
        return _extended(cls, SchedulerOutput, scheduler_output, wedlm_plan=plan)


def plan_of(scheduler_output: SchedulerOutput) -> WeDLMStepPlan:
    """The step's plan; ``EMPTY_PLAN`` for an output vLLM made itself (an empty or dummy step)."""
    return scheduler_output.wedlm_plan if isinstance(scheduler_output, WeDLMSchedulerOutput) else EMPTY_PLAN


@dataclass
class WeDLMRunnerOutput(ModelRunnerOutput):
    """vLLM's runner output plus each request's next window.

    ``sampled_token_ids`` holds the tokens this step decided (possibly none). The next window
    travels with the output (it is pickled to the scheduler like the rest), and the scheduler
    schedules it as the request's next draft tokens.
    """

    # req_id -> next step's draft tokens in physical order (filled slots first, then masks)
    next_windows: dict[str, list[int]] = field(default_factory=dict)
    # req_id -> how many of this step's sampled tokens lead the request's next window: decided
    # (every slot before them filled) but not forwarded yet. vLLM counts every sampled token of a
    # request with drafts as an accepted draft, whose KV this step wrote; these have none yet.
    unforwarded: dict[str, int] = field(default_factory=dict)
    # Fixed window rows, adaptive window: req_id -> how many slots follow the leading run of the
    # window this step planned for it (its length, less that run), as the device's table holds it.
    # The scheduler otherwise knows only a bound (every fill a wider window left, kept until committed).
    window_spans: dict[str, int] = field(default_factory=dict)


def wedlm_output(output: ModelRunnerOutput, **wedlm_fields) -> WeDLMRunnerOutput:
    """vLLM's ``output`` as a ``WeDLMRunnerOutput`` with ``wedlm_fields`` (the others empty)."""
    return _extended(WeDLMRunnerOutput, type(output), output, **wedlm_fields)


def _extended(cls: type, base: type, obj: object, **extra):
    """A ``cls`` (a dataclass extending ``base``) holding ``obj``'s ``base`` fields (the same objects)
    and ``extra``."""
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(base)}, **extra)
