"""vLLM's scheduler, counting WeDLM windows instead of one sampled token per step.

A WeDLM window rides on vLLM's speculative-decoding data path. Its leading filled run is already
output (the runner returned it the step it was decided, like an AR token the step it is drawn,
so its KV is still to be written); the rest of the window is the request's "draft" tokens,
scheduled after it, KV written at ``num_computed_tokens + j``. Differences from speculative
decoding:

* no step samples a bonus token (``num_sampled_tokens_per_step = 0``);
* every draft is treated like a rejected one (scratch KV, overwritten next step):
  ``num_computed_tokens`` advances by the leading run only. vLLM counts a step's sampled tokens
  as accepted drafts; those that lead the next window (``WeDLMRunnerOutput.unforwarded``) are
  taken back out. A lossless window's sampled tokens are its verified run, accepted drafts indeed;
* the next window comes back with the runner's output rather than from a drafter;
* a request's first window rides with the last rows of its prompt (``_ride_first_windows``): the
  window's masks only attend to the prompt, so the forward that writes the prompt's KV can carry
  them, and the first tokens come one forward earlier than from a window forwarded after the
  prefill (as the reference decoder runs it; the same computation).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from vllm_wedlm.adapter.async_gate import padding_gate, step_cost
from vllm_wedlm.adapter.grammar_rows import note_reasoning_end
from vllm_wedlm.adapter.held_prompt_logprobs import HeldPromptLogprobs
from vllm_wedlm.adapter.protocol import (
    RequestKind,
    RequestRecord,
    WeDLMRunnerOutput,
    WeDLMSchedulerOutput,
    WeDLMStepPlan,
    classify,
    plan_of,
)
from vllm_wedlm.adapter.run_output import append_run
from vllm_wedlm.adapter.window_sizer import WindowSizer
from vllm_wedlm.config import WeDLMSettings, max_window_tokens

# Under "vllm." so that vLLM's logging configuration (handler, level, format) applies.
logger = init_logger("vllm.wedlm")

#: Seconds between two "WeDLM decoding" log lines (only while requests decode).
LOG_INTERVAL_S = 5.0


@dataclass
class SchedulerRequest:
    """What the scheduler keeps of one request from its arrival to its end (``_free_request``): its
    record, and on fixed window rows what the host knows of its window."""

    record: RequestRecord  # (``protocol.classify``)
    # Fixed rows: its prefill is scheduled to the end, so each of its steps is a window; the leading
    # run its last finished step returned (what its next window adds to W; None: none yet); and at
    # most how many slots follow the leading run of the window that step planned (``_span``; None:
    # its W), kept through a preemption, as the window is. The first two go at a preemption.
    windowed: bool = False
    run: int | None = None
    span: int | None = None


@dataclass
class CommitStats:
    """Counts since the last log line. A request-forward is one request's window in one step."""

    request_forwards: int = 0
    committed_tokens: int = 0
    window_tokens: int = 0
    # With the adaptive window: W -> the request-forwards of a window of that W (W 0: an AR step's
    # forward, or a window of its leading run alone on fixed rows).
    window_sizes: Counter[int] = field(default_factory=Counter)

    def line(self) -> str:
        tpf = self.committed_tokens / max(self.request_forwards, 1)
        line = (f"WeDLM decoding: {tpf:.2f} tokens per forward ({self.committed_tokens} tokens committed in "
                f"{self.request_forwards} request-forwards of {self.window_tokens} window tokens)")
        if self.window_sizes:  # e.g. "their W: 0 92%, 1 5%, 16 3%"
            total = self.window_sizes.total()
            shares = (f"{w} {100 * n / total:.0f}%" for w, n in sorted(self.window_sizes.items()))
            line += "; their W: " + ", ".join(shares)
        return line


class WeDLMScheduler(Scheduler):
    #: Whether the adaptive window may choose W 0, an AR step of the batch: a synchronous engine of
    #: exact rows, which times its own steps and hands such a step to vLLM whole.
    takes_ar_steps = True
    #: Whether the adaptive window may give a request's window W 0 on its own (one AR row, per
    #: request): the engine of fixed window rows, whose steps' rows are the requests' own.
    takes_zero_windows = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
        self.commit_stats = CommitStats()
        self.wedlm = WeDLMSettings.from_additional_config(self.vllm_config.additional_config)
        self._mask_id = int(self.vllm_config.model_config.hf_config.mask_token_id)
        # Every request's record (``protocol.classify``: its kind, knobs, pin) and what the scheduler
        # keeps of it, made when it arrives and forgotten when it is freed (``_free_request``).
        self._states: dict[str, SchedulerRequest] = {}
        self._forwarded: dict[str, int] = {}
        self._forwarded_sizes: dict[str, int] = {}  # req_id -> W of the window forwarded (the log line's)
        # The step being scheduled, for its plan (``_step_plan``): the W of each window it plans and
        # of each it forwards (the adaptive window), and the first windows riding with a prompt.
        self._window_sizes: dict[str, int] = {}
        self._forwarded_now: dict[str, int] = {}
        self._first_windows: dict[str, int] = {}
        # req_id -> the step's statistics (None when not logged), for each request whose window the
        # step being updated forwarded: its committed tokens are counted once its output is appended.
        self._window_stats: dict[str, SpecDecodingStats | None] = {}
        # The diffusion counters of a step's forwards of W 0 without drafts (an AR step's, a W 0 window
        # drawn from a re-prefill), until vLLM makes the step's stats.
        self._undrafted_stats: SpecDecodingStats | None = None
        # Prompt log-probs computed with a step that returned no token, until one does.
        self._prompt_logprobs = HeldPromptLogprobs()
        self._last_log = time.monotonic()
        # The adaptive window: each request's W per step (None: always the server's W), W 0 included
        # on this synchronous engine (an AR step of the whole batch, ``_steps_ar``).
        self._sizer = (WindowSizer(self.wedlm.window_size,
                                   step_cost(self.vllm_config.model_config.hf_text_config, self.wedlm.window_tokens),
                                   ar_steps=self.takes_ar_steps and self.wedlm.ar_steps,
                                   ar_step_cost=self.wedlm.ar_step_cost,
                                   zero_windows=self.takes_zero_windows and self.wedlm.ar_steps)
                       if self.wedlm.wedlm and self.wedlm.adaptive_window else None)
        # The requests whose next window may have W 0 (``takes_zero_windows``), asked each step.
        self._zero_ok: set[str] | frozenset = frozenset()
        # Whether the step being scheduled is an AR step (W 0), when its schedule began, and what its
        # time is counted as once it is back (batch, window rows or None for AR; None: not timed).
        self._ar_step = False
        self._step_began = 0.0
        self._timed_step: tuple[int, int | None] | None = None

    def add_request(self, request) -> None:
        record = classify(request.sampling_params, self.wedlm)
        self._states[request.request_id] = SchedulerRequest(record)
        if record.pin_error is not None:
            # The front end refused pins this server cannot run (request_validator.py) where it built
            # the engine's config; one that did not (one of several API servers) let this one through.
            logger.warning("WeDLM: request %s runs at W %s: %s", request.request_id,
                           record.pinned_window or self.wedlm.window_size, record.pin_error)
        if self._sizer is not None and record.pinned_window is not None:
            self._sizer.pin(request.request_id, record.pinned_window)  # (``WindowSizer.pin``)
        super().add_request(request)

    def _decodes_ar(self, request) -> bool:
        return self._states[request.request_id].record.kind is RequestKind.AR

    def get_grammar_bitmask(self, scheduler_output) -> GrammarOutput | None:
        # vLLM's, for the structured-output requests decoded AR only: the grammar of one decoded in
        # windows runs in the runner (adapter/grammar_rows.py), which masks its first undecided slot
        # and checks its run, and vLLM's mask for draft tokens would read its window's masks as tokens.
        if not scheduler_output.has_structured_output_requests:
            return None
        req_ids = [req_id for req_id in scheduler_output.num_scheduled_tokens
                   if (request := self.requests.get(req_id)) and request.use_structured_output
                   and not request.is_prefill_chunk and self._decodes_ar(request)]
        if not req_ids:
            return None
        bitmask = self.structured_output_manager.grammar_bitmask(self.requests, req_ids,
                                                                 scheduler_output.scheduled_spec_decode_tokens)
        return GrammarOutput(req_ids, bitmask)

    def window_of(self, request) -> int:
        """W of the window the runner holds for ``request`` (or plans in the step being scheduled)."""
        return self.wedlm.window_size if self._sizer is None else self._sizer.window_of(request.request_id)

    def schedule(self, *args, **kwargs) -> WeDLMSchedulerOutput:
        self._step_began = time.perf_counter()
        withheld = self._steps_ar() if self._sizer is not None and self._sizer.ar_steps else None
        self._ar_step = withheld is not None
        scheduler_output = super().schedule(*args, **kwargs)
        for request, (drafts, rewound) in (withheld or {}).items():
            # A running window the step left out (no token budget left) keeps its window as it was:
            # the runner saw nothing of it.
            scheduled = request.request_id in scheduler_output.num_scheduled_tokens
            if not scheduled and request.status == RequestStatus.RUNNING:
                request.spec_token_ids = drafts
                request.num_computed_tokens += rewound
        return WeDLMSchedulerOutput.of(scheduler_output, self._step_plan())

    def _step_plan(self) -> WeDLMStepPlan:
        """The plan of the step just scheduled (``_update_after_schedule`` made its parts)."""
        return WeDLMStepPlan(window_sizes=self._window_sizes, forwarded_sizes=self._forwarded_now,
                             first_windows=self._first_windows)

    def _steps_ar(self) -> dict | None:
        """Whether the step about to be scheduled is an AR step (W 0) of every running WeDLM request
        (``WindowSizer.steps_ar``); if so, their windows are sent without drafts: vLLM forwards each
        one's leading run (output it already has) and the runner draws the next token from its last
        row, as in vLLM's own AR step. A window with no run rewinds its last committed token, whose
        row then draws (its KV is written again, the same values): a lossless window, whose slot 0 is
        a token drawn from that row and not returned yet, so draws it again. Only where no such request
        has a grammar (a grammar window's state is the runner's). Returns each window's drafts and
        rewound tokens (None: not an AR step)."""
        windowed = [request for request in self.running if not self._decodes_ar(request)]  # (a record each)
        if not windowed or any(request.use_structured_output for request in windowed):
            return None
        if not self._sizer.steps_ar([request.request_id for request in windowed]):
            return None
        withheld = {}
        for request in windowed:
            if request.spec_token_ids:
                rewound = int(request.num_computed_tokens >= request.num_tokens)
                withheld[request] = (request.spec_token_ids, rewound)
                request.spec_token_ids = []
                request.num_computed_tokens -= rewound
        return withheld

    def _update_after_schedule(self, scheduler_output) -> None:
        # vLLM advances num_computed_tokens by each request's scheduled tokens here, drafts
        # included (rejected ones are taken back in update_from_output): add first windows first,
        # of the W chosen for them now.
        windowless = None  # where W can be 0: the requests of the step the runner holds no window for
        self._window_sizes, self._forwarded_now = {}, {}
        if self._sizer is not None:
            windowless, stepping_ar, planning = self._windows_of_step(scheduler_output)
            self._window_sizes, self._forwarded_now = self._sizer.assign(planning, stepping_ar, self._zero_ok)
        self._first_windows = self._ride_first_windows(scheduler_output, windowless)
        self._timed_step = None if windowless is None else self._timing(scheduler_output)
        super()._update_after_schedule(scheduler_output)

    def _windows_of_step(self, scheduler_output) -> tuple[set[str] | None, list[str], list[str]]:
        """The adaptive window's view of a step just scheduled, in one pass over its requests (the
        scheduler makes it every step, for every request):

        * ``windowless``, where W can be 0 (else None): the requests the runner holds no window for;
        * ``stepping_ar``, in an AR step: the requests that take W 0, the WeDLM requests without a
          grammar that forward up to their last token (each draws one); a prompt's chunk draws
          nothing, and a grammar request admitted now plans its window as always;
        * ``planning``: the WeDLM requests that plan a window at the step's end, those whose window
          it forwards and those who hold no window and forward up to their last token (a prompt,
          or the token an AR step drew), but not a request that had a window before a preemption
          (the runner keeps it as it was, of the W it was planned with), nor those stepping AR."""
        drafted = scheduler_output.scheduled_spec_decode_tokens
        windowless = set() if self._sizer.ar_steps else None
        stepping_ar, planning = [], []
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            holds_window = self._sizer.holds_window(req_id)
            if windowless is not None and not holds_window:
                windowless.add(req_id)
            # A WeDLM request that forwards up to its last token: it draws, or plans a window.
            completes_wedlm = (request.num_computed_tokens + num_tokens >= request.num_tokens
                               and self._states[req_id].record.windowed)
            steps_ar = completes_wedlm and self._ar_step and not request.use_structured_output
            if steps_ar:
                stepping_ar.append(req_id)
            if req_id in drafted or (completes_wedlm and not holds_window and not steps_ar):
                planning.append(req_id)
        return windowless, stepping_ar, planning

    def _timing(self, scheduler_output) -> tuple[int, int | None] | None:
        """What the step is timed as (``StepTimes.record``): (its requests, None) for an AR step,
        (its requests, its rows) for a window step; None where a prompt's rows are in it (a new
        request's, or a re-prefill longer than a window's run)."""
        scheduled, drafted = scheduler_output.num_scheduled_tokens, scheduler_output.scheduled_spec_decode_tokens
        if not scheduled or scheduler_output.scheduled_new_reqs:
            return None
        if any(n - len(drafted.get(req_id, ())) > self.wedlm.window_size + 1 for req_id, n in scheduled.items()):
            return None
        return len(scheduled), None if self._ar_step else scheduler_output.total_num_scheduled_tokens

    def _ride_first_windows(self, scheduler_output, windowless: set[str] | None = None) -> dict[str, int]:
        """Schedule the first window of each plain WeDLM request whose prompt's prefill ends in this
        step, as drafts after its last prompt tokens, where the step's token budget and the KV cache
        have room (else it comes the step after, as any window does); the windows added. With the
        adaptive window, also the window after an AR step (W 0), after the token that step drew.

        Not for a lossless request (its first window starts with the token drawn from the prompt's
        last row), an AR-decoded one (no window), one stepping AR now, or one that holds a window
        (``windowless``: the requests that hold none, where W can be 0; else those with no output that
        were never preempted).
        """
        budget = self.max_num_scheduled_tokens - scheduler_output.total_num_scheduled_tokens
        scheduled = scheduler_output.num_scheduled_tokens
        chosen = self._window_sizes
        firsts: dict[str, int] = {}
        for req_id, num_tokens in scheduled.items():
            request = self.requests[req_id]
            holds_window = (req_id not in windowless if windowless is not None
                            else request.num_output_tokens or request.num_preemptions)
            if (req_id in scheduler_output.scheduled_spec_decode_tokens
                    or request.num_computed_tokens + num_tokens < request.num_tokens  # a prefill chunk
                    or holds_window or chosen.get(req_id) == 0 or not self._plain_wedlm(request)):
                continue
            # The runner's plan of an empty window: W masks, cut where the KV room ends.
            size = min(self.window_of(request), self.max_model_len - request.num_tokens)
            if not 0 < size <= budget:
                continue
            blocks = self.kv_cache_manager.allocate_slots(request, num_tokens + size)
            if blocks is None:
                continue
            budget -= size
            firsts[req_id] = size
            scheduled[req_id] = num_tokens + size
            scheduler_output.total_num_scheduled_tokens += size
            scheduler_output.scheduled_spec_decode_tokens[req_id] = [self._mask_id] * size
            _add_block_ids(scheduler_output, req_id, blocks.get_block_ids(allow_none=True))
        if firsts and self.needs_kv_cache_zeroing:
            scheduler_output.new_block_ids_to_zero = ((scheduler_output.new_block_ids_to_zero or [])
                                                      + (self._get_new_block_ids_to_zero() or [])) or None
        return firsts

    def _free_request(self, request, *args, **kwargs):
        if self._sizer is not None:
            self._sizer.forget(request.request_id)  # finished or aborted
        self._states.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)

    def _plain_wedlm(self, request) -> bool:
        return self._states[request.request_id].record.kind is RequestKind.PLAIN

    def update_from_output(self, scheduler_output, model_runner_output):
        plan = plan_of(scheduler_output)
        # req_id -> window slots forwarded (a first window's prompt rows are not)
        self._forwarded = {**scheduler_output.num_scheduled_tokens, **plan.first_windows}
        # req_id -> W of the window forwarded (the adaptive window), for the log line
        self._forwarded_sizes = plan.forwarded_sizes
        self._window_stats = {}
        undrafted = self._undrafted_forwards(scheduler_output, plan)
        if undrafted:  # forwards of W 0 without drafts: a request-forward each, its token counted once appended
            stats = self._count_undrafted(len(undrafted), sum(undrafted.values()))
            self._window_stats.update(dict.fromkeys(undrafted, stats))
        if isinstance(model_runner_output, WeDLMRunnerOutput):
            # vLLM will count these as accepted drafts (KV written); their KV is written next step.
            for req_id, count in model_runner_output.unforwarded.items():
                request = self.requests.get(req_id)
                if request is not None and not request.is_finished():
                    request.num_computed_tokens -= count
        self._prompt_logprobs.hold(model_runner_output, self.requests)
        if self._sizer is not None and model_runner_output.sampled_token_ids:
            sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
            self._sizer.observe(plan.forwarded_sizes, {req_id: len(sampled[index[req_id]])
                                                       for req_id in scheduler_output.scheduled_spec_decode_tokens
                                                       if req_id in index})
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if isinstance(model_runner_output, WeDLMRunnerOutput):
            for req_id, window in model_runner_output.next_windows.items():
                request = self.requests.get(req_id)
                if request is not None and not request.is_finished() and not request.is_prefill_chunk:
                    request.spec_token_ids = window
        if self._timed_step is not None:
            batch, rows = self._timed_step
            self._sizer.times.record(batch, time.perf_counter() - self._step_began, rows)
            self._timed_step = None
        now = time.monotonic()
        if self.commit_stats.request_forwards and now - self._last_log >= LOG_INTERVAL_S:
            logger.info(self.commit_stats.line())
            self.commit_stats, self._last_log = CommitStats(), now
        return outputs

    def _undrafted_forwards(self, scheduler_output, plan: WeDLMStepPlan) -> dict[str, int]:
        """The forwards of W 0 in a finished step that had no drafts (so vLLM counts none of them),
        with their rows: here an AR step's (W 0 in the step's ``plan``), each request's leading run.
        On fixed rows W 0 is a window's own, counted as any window's forward."""
        if not self.takes_ar_steps:
            return {}
        scheduled = scheduler_output.num_scheduled_tokens
        return {req_id: scheduled.get(req_id, 0) for req_id, window_size in plan.window_sizes.items()
                if window_size == 0}

    def _update_request_with_output(self, request, new_token_ids):
        # A window's run in one pass rather than vLLM's token-by-token loop (run_output.py).
        appended = append_run(request, new_token_ids, self.max_model_len)
        if appended is None:
            appended = super()._update_request_with_output(request, new_token_ids)
        return self._count_returned(request, appended)

    def _count_returned(self, request, appended: tuple[list[int], bool]) -> tuple[list[int], bool]:
        """Count what a request whose window this step forwarded got of its run (``appended``: the
        tokens kept and whether it stopped; max_tokens, EOS and stop tokens cut a run): the committed
        tokens of the log line and of vLLM's diffusion counter are the tokens users received."""
        if request.use_structured_output and not self._decodes_ar(request):
            note_reasoning_end(self.structured_output_manager, request, appended[0])
        if request.request_id in self._window_stats:
            stats = self._window_stats.pop(request.request_id)
            self.commit_stats.committed_tokens += len(appended[0])
            if stats is not None:
                stats.num_accepted_tokens += len(appended[0])
        return appended

    def _count_undrafted(self, forwards: int, rows: int) -> SpecDecodingStats | None:
        """Count ``forwards`` forwards of W 0 without drafts (``_undrafted_forwards``, ``rows`` rows in
        all) as windows' forwards are counted (``_count_forward``). vLLM makes a step's statistics
        only from requests with drafts: these wait for ``make_stats``."""
        self._undrafted_stats = self._count_forward(self._undrafted_stats, rows, forwards)
        self.commit_stats.window_sizes[0] += forwards
        return self._undrafted_stats

    def _count_forward(self, stats: SpecDecodingStats | None, rows: int, forwards: int = 1) -> SpecDecodingStats | None:
        """Count ``forwards`` request-forwards of ``rows`` rows in all in the log line and, where
        statistics are on, in ``stats`` (made if None; returned, else None): vLLM's diffusion counters
        read each as a denoising step and its rows as canvas positions (adapter/metrics.py); their
        committed tokens are added once appended (``_count_returned``). Filled directly:
        SpecDecodingStats.observe_draft assumes at most num_speculative_tokens accepted, and its
        per-position vector means nothing here."""
        self.commit_stats.request_forwards += forwards
        self.commit_stats.window_tokens += rows
        if not self.log_stats:
            return None
        if stats is None:
            stats = SpecDecodingStats.new(0)
        stats.num_drafts += forwards
        stats.num_draft_tokens += rows
        return stats

    def make_stats(self, spec_decoding_stats=None, kv_connector_stats=None, cudagraph_stats=None, perf_stats=None):
        # The step's forwards without drafts (``_count_undrafted``) join its window forwards' counts.
        ar_step, self._undrafted_stats = self._undrafted_stats, None
        if ar_step is not None and spec_decoding_stats is None:
            spec_decoding_stats = ar_step
        elif ar_step is not None:
            spec_decoding_stats.num_drafts += ar_step.num_drafts
            spec_decoding_stats.num_draft_tokens += ar_step.num_draft_tokens
            spec_decoding_stats.num_accepted_tokens += ar_step.num_accepted_tokens
        return super().make_stats(spec_decoding_stats, kv_connector_stats, cudagraph_stats, perf_stats)

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        # Called once per request whose window was forwarded (a request decoded AR on this
        # engine has none), with its draft count and the tokens the step returned before any
        # stop cuts them: one request-forward. Its committed tokens are counted once the run is
        # appended (``_count_returned``), from what the request keeps.
        window_tokens = self._forwarded.get(request_id, num_draft_tokens)  # the leading run, then the drafts
        counted = self._count_forward(spec_decoding_stats, window_tokens)
        if self._sizer is not None:
            self.commit_stats.window_sizes[self._forwarded_sizes.get(request_id, self.wedlm.window_size)] += 1
        self._window_stats[request_id] = counted
        return spec_decoding_stats if counted is None else counted

    def shutdown(self) -> None:
        if self.commit_stats.request_forwards:
            logger.info(self.commit_stats.line())
        super().shutdown()


class WeDLMFixedRowsScheduler(WeDLMScheduler, AsyncScheduler):
    """The scheduler of fixed window rows (``config.FIXED_ROWS_KEY``), with or without async scheduling.

    The runner lays out a window's rows from its device table, so a step can be scheduled before
    the one before it is back (pipelined; vLLM's ``AsyncScheduler`` overlaps it with that step's
    forward). The host then does not know the window's leading run yet: the window forwards
    Q = 2W rows, the most one can need, or, where that padding costs more forward time than the
    overlap hides (``async_gate.PaddingGate``, asked each step), W rows and the run its last
    finished step returned; if its run is longer, the window is void for that step (``_rows``). The
    host knows a window only as placeholder drafts; what a step returns is each next window's
    leading run, as in ``WeDLMScheduler``. Counts per request (N tokens, C ``num_computed_tokens``,
    P output placeholders):

    * before each schedule, a window to forward R rows gets ``R + C - N - P`` placeholder drafts,
      so that vLLM schedules exactly R rows (``N + drafts + P - C``); all of them count as drafts;
    * a step's output removes its drafts again: vLLM takes the rejected ones, ``update_from_output``
      the accepted ones, the run they report, unless the request's next window step is in flight
      already, which forwards that run (void or not) and counted it when it was scheduled. So ``C - P``
      is the KV frontier of the steps scheduled so far, short of the runs not back yet (which
      vLLM's async scheduler caches up to), and with no step in flight ``C`` is the frontier
      itself, where the next window starts, and ``N - C`` its run;
    * a window in flight is left out of a schedule when vLLM would cut its next rows at
      ``max_model_len`` (C only bounds the start from above while a step is in flight): it then
      starts at C exactly, and the runner's plan keeps it within ``max_model_len``.

    A lossless window (``wedlm_lossless``) returns its verified run, whose KV its step wrote: vLLM's
    own accounting of accepted drafts is then right, and ``C`` is the window's start with no step in
    flight (``N - C`` is 0). Its leading run is unverified fills the host never sees, so it always
    forwards 2W rows.

    An adaptive window of W 0 (``window_sizer.py``) is its leading run alone: its rows are that run and
    S = 1 (the one token it draws, its next run), so a request at W 0 forwards one row a step while
    its step before is in flight. With no step in flight it gets its run and one row more (a scratch
    row after it), so that it has a draft and reads as a window. Re-prefilled after a preemption, it
    draws from the re-prefill's last row, which returns that token: one output placeholder for it.

    A request decoded AR on this engine (``wedlm_decoding: ar``) is counted as vLLM's async
    scheduler counts an AR request: one output placeholder per step that draws (vLLM's
    ``num_sampled_tokens_per_step``, 0 here for the windows), no drafts, and left out of a schedule
    where its next draw would pass ``max_model_len`` (vLLM's clamp subtracts the same engine-wide 0).
    """

    takes_ar_steps = False  # its steps overlap (none is timed alone) and its windows live on the device
    takes_zero_windows = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
        self._window_rows = max_window_tokens(self.wedlm.window_size)  # Q
        self._gate = padding_gate(self.scheduler_config.async_scheduling, self.vllm_config.model_config.hf_text_config,
                                  self.wedlm.async_padding_tokens)
        logger.info("WeDLM: a pipelined step pads windows to 2W rows while they cost at most %d tokens of forward "
                    "beyond %d", self._gate.budget, self._gate.knee)
        # (What the host knows of each window: ``SchedulerRequest``. A lossless request's window
        # steps forward Q rows each: its leading run, unverified and known on the device only, then W
        # slots; each returns its verified run, KV written.)
        # The steps scheduled and not yet back (at most two: vLLM's batch queue), oldest first: each
        # one's plan and the requests whose windows (drafts) it forwards.
        self._in_flight: list[tuple[WeDLMStepPlan, frozenset[str]]] = []
        # The step being scheduled: the most slots after the leading run of a plain window running
        # now, whether the gate padded its windows, and its windows of W 0 drawn from a re-prefill's
        # last row (the plan's ``mask_rows``, ``padded``, ``redrawn``).
        self._mask_rows = 0
        self._mask_rows_now = 1
        self._padded = True
        self._redrawn_now: tuple[str, ...] = ()

    def _update_request_with_output(self, request, new_token_ids):
        # vLLM's async accounting of output placeholders wraps the per-token loop, which it calls
        # through super() (Scheduler's, next after AsyncScheduler in this class's order): this
        # engine keeps that loop rather than a copy of that accounting around append_run.
        return self._count_returned(request, AsyncScheduler._update_request_with_output(self, request, new_token_ids))

    def _lossless(self, req_id: str) -> bool:
        return self._states[req_id].record.kind is RequestKind.LOSSLESS

    def _forget(self, req_id: str) -> None:
        """A preempted request prefills again first: not windowed, no run known (its span stays)."""
        state = self._states[req_id]
        state.windowed, state.run = False, None

    def schedule(self, *args, **kwargs) -> WeDLMSchedulerOutput:
        # Each running window's W and span (``_span``), asked once a step: the gate, its rows and the
        # step's logits rows follow from them.
        shapes = {}
        for request in self.running:
            if self._states[request.request_id].windowed:
                w = self.window_of(request)
                shapes[request.request_id] = (w, self._span(request, w))
        exact = padding = 0
        self._mask_rows = 0
        for req_id, (w, span) in shapes.items():
            if self._lossless(req_id):  # 2W rows either way
                exact += max_window_tokens(w)
                padding += max_window_tokens(w)
            else:
                exact += w + (self._states[req_id].run or 0)
                padding += span + w
                self._mask_rows = max(self._mask_rows, w, span)
        padded = self._padded = self._gate.pipelines(padding, exact)
        if self._sizer is not None and self._sizer.zero_windows:
            # W 0 needs a run to draw from: the window forwarded now has at most one slot after its
            # run, and that one a mask (W <= 1, no fill left further right: S <= 1), which the step
            # fills (at least one mask is, the first by then); unless the step is not padded, where a
            # window may be void and fill nothing. Only plain requests that ask for nothing per row
            # (``RequestRecord.zero_eligible``).
            self._zero_ok = {req_id for req_id, (w, span) in shapes.items()
                             if padded and w <= 1 and span <= 1 and self._states[req_id].record.zero_eligible}
        held, kept = [], []
        for request in self.running:
            if self._decodes_ar(request):
                rows = self._ar_rows(request)
            elif request.request_id in shapes:
                rows = self._rows(request, padded, *shapes[request.request_id])
            else:
                rows = 0
            if rows is None:
                held.append(request)
                continue
            kept.append(request)
            if rows:
                drafts = rows + request.num_computed_tokens - request.num_tokens - request.num_output_placeholders
                request.spec_token_ids = [-1] * drafts
        if held:
            # Out of vLLM's sight for this schedule, but still running: not a free place for a
            # waiting request (the runner's batch holds max_num_seqs requests).
            self.running = kept
            self.max_num_running_reqs -= len(held)
        try:
            scheduler_output = super().schedule(*args, **kwargs)
        finally:
            if held:
                self.running = held + self.running
                self.max_num_running_reqs += len(held)
        self._in_flight.append((scheduler_output.wedlm_plan, frozenset(scheduler_output.scheduled_spec_decode_tokens)))
        return scheduler_output

    def _step_plan(self) -> WeDLMStepPlan:
        return dataclasses.replace(super()._step_plan(), mask_rows=self._mask_rows_now, padded=self._padded,
                                   redrawn=self._redrawn_now)

    def _rows(self, request, padded: bool, window_size: int, span: int) -> int | None:
        """The rows of a windowed request's next window step, or None to hold it out of this schedule.

        W is the window's own (the server's, or the W an adaptive window was planned with), and S
        bounds the slots after its leading run (``_span``: W, or more for an adaptive window that
        still holds fills from a wider one). With no step of it in flight the host knows its run
        (``N - C``): run + S rows, or at least S + W where the gate pads (2W at a fixed W: a
        synchronous engine's steps, or windows that were held). With one in flight its run is unknown
        but at most S: S + W rows where the gate pads (2W at a fixed W), else W and the run its last
        finished step returned (at least S), a prediction the runner checks (a longer window is void
        for the step and writes only its run's KV, ``window_step.fixed_rows_window_step``). A lossless
        window always gets 2W rows: its leading run is unverified fills the host never sees, and its
        verification cuts it to W slots after the run it commits. Held where the rows could pass
        ``max_model_len`` (C bounds the window's start from above while a step is in flight).
        ``window_size`` and ``span``: the window's W and S (``window_of``, ``_span``)."""
        computed = request.num_computed_tokens
        lossless = self._lossless(request.request_id)  # its leading run is known on the device only
        if not request.num_output_placeholders:  # vLLM cuts the rows at max_model_len
            run = request.num_tokens - computed
            return max_window_tokens(window_size) if lossless else (max(run, window_size) if padded else run) + span
        if lossless:
            rows = max_window_tokens(window_size)
        else:
            run = self._states[request.request_id].run
            rows = span + window_size if padded else max(window_size + (span if run is None else run), span)
        return None if computed + rows > self.max_model_len else rows

    def _span(self, request, window_size: int) -> int:
        """At most how many slots follow the leading run of ``request``'s window: its W
        (``window_size``), unless a wider W before left fills further right (an adaptive window),
        which stay until committed."""
        span = self._states[request.request_id].span
        return max(window_size, 1) if span is None else span

    def _ar_rows(self, request) -> int | None:
        """0 (vLLM schedules an AR request's tokens itself), or None to hold it out of this schedule:
        while a step of it is in flight, where the next step's draw would pass ``max_model_len``
        (its row at C, its draw at C + 1)."""
        if request.num_output_placeholders and request.num_computed_tokens + 2 > self.max_model_len:
            return None
        return 0

    def _preempt_request(self, request, timestamp: float) -> None:
        self._forget(request.request_id)  # it prefills again first
        super()._preempt_request(request, timestamp)

    def _update_after_schedule(self, scheduler_output) -> None:
        super()._update_after_schedule(scheduler_output)
        # The most slots after a plain window's leading run in this step: those of the windows
        # running (``schedule``) and of the first windows riding with a prompt (W masks each).
        self._mask_rows_now = max([self._mask_rows, 1, *self._first_windows.values()])
        redrawn = []
        forwarded = self._forwarded_now
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if self._decodes_ar(request):
                # vLLM's async scheduler gave it the engine's placeholders: no drafts, no sampled token.
                request.spec_token_ids = []
                if not request.is_prefill_chunk:
                    request.num_output_placeholders += 1  # the token this step draws
            elif request.num_computed_tokens >= request.num_tokens:
                if not self._states[req_id].windowed and forwarded.get(req_id) == 0:
                    # Re-prefilled after a preemption while its window had W 0: the step draws from its
                    # last row, as that window's forward would have, and returns the draw.
                    request.num_output_placeholders += 1
                    redrawn.append(req_id)
                self._states[req_id].windowed = True
        self._redrawn_now = tuple(redrawn)

    def update_from_output(self, scheduler_output, model_runner_output):
        plan = plan_of(scheduler_output)
        # The step is back: out of the steps in flight (the same plan object its schedule returned).
        self._in_flight = [step for step in self._in_flight if step[0] is not plan]
        drafted = scheduler_output.scheduled_spec_decode_tokens
        sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
        spans = getattr(model_runner_output, "window_spans", None) or {}  # the device's (adaptive window)
        chosen = plan.window_sizes  # the W each window was planned with
        # The requests whose next window step is in flight already (scheduled pipelined, before this
        # output): that step forwards the run this one returns, void or not, and counted it when it
        # was scheduled. Otherwise the run is still to be scheduled.
        pipelined = set().union(*(later for _, later in self._in_flight))
        for req_id in drafted:
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING or not sampled:
                self._planned(req_id, chosen, request, 0)  # (preempted: it keeps that window)
                continue
            # The run a window step returns is the next window's leading run, whose KV the
            # request's next window step writes.
            run = len(sampled[index[req_id]])
            if self._lossless(req_id):
                continue  # its verified run: KV written by this step, as vLLM counts accepted drafts
            self._planned(req_id, chosen, request, run, spans.get(req_id))
            if req_id not in pipelined:
                request.num_computed_tokens -= run
            state = self._states[req_id]
            if state.windowed:
                state.run = run
        for req_id in set(chosen) - set(drafted):
            # a first window, planned after its prompt: no run
            self._planned(req_id, chosen, self.requests.get(req_id), 0)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _undrafted_forwards(self, scheduler_output, plan: WeDLMStepPlan) -> dict[str, int]:
        # A window of W 0 re-prefilled after a preemption: its forward is its draw's row.
        return dict.fromkeys(plan.redrawn, 1)

    def _planned(self, req_id: str, chosen: dict[str, int], request, run: int, span: int | None = None) -> None:
        """Bound the slots after the leading run (``run``) of the window a finished step planned for
        ``req_id`` (``request``, None if gone) with W (``chosen``: the step plan's ``window_sizes``):
        the ``span`` the runner reports (the window's length in the device's table, less that run:
        ``FixedRows.window_spans``), else W or what the window before held after its run, less this
        run (the plan keeps every fill, up to the last). A window of W 0 has no slot after its run,
        but its step's run is its one draw: its bound is 1."""
        if req_id in chosen and request and not request.is_finished() and not self._lossless(req_id):
            window_size = chosen[req_id]
            if span is None:
                before = self._states[req_id].span
                span = max(window_size, (window_size if before is None else before) - run)
            self._states[req_id].span = max(span, 1)


def _add_block_ids(scheduler_output, req_id: str, block_ids: tuple[list[int], ...] | None) -> None:
    """Append KV blocks allocated after vLLM built the step's output to the request's entry in it
    (one list per KV cache group)."""
    if block_ids is None:
        return
    known = next((new.block_ids for new in scheduler_output.scheduled_new_reqs if new.req_id == req_id), None)
    if known is None:  # a running request (its prompt's last chunk)
        cached = scheduler_output.scheduled_cached_reqs
        index = cached.req_ids.index(req_id)
        known = cached.new_block_ids[index]
        if known is None:
            cached.new_block_ids[index] = block_ids
            return
    for group, ids in zip(known, block_ids, strict=True):
        group.extend(ids)
