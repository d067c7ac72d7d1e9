"""The WeDLM overrides of vLLM's V1 model runner, shared by the CPU and GPU workers.

Per step and request, the scheduler hands over either a prefill chunk or a window. How a window's
rows are laid out and finished depends on the scheduling, so it lives in one of two row layouts
chosen once at start-up (``row_layout.py``: ``ExactRows`` under synchronous scheduling,
``FixedRows`` under async scheduling); this runner keeps what both share (each request's state,
the window table, counters) and hands the layout each moment of a step, in the order vLLM calls
them:

* ``_update_states``: forget the window of finished and new requests. A preempted request keeps
  its window (filled, unforwarded slots included): vLLM re-prefills its tokens, some steps later
  and perhaps in chunks, and the window resumes exactly where it stopped;
* ``_prepare_inputs``: the layout plans the first windows that came with a prompt, writes the
  window rows' logical RoPE positions, and asks for the logits rows the step needs;
* ``_sample``: the layout runs ``core`` (entropy, selection, sampling, commit, refill) instead of
  vLLM's sampler. A step's sampled tokens are what each request returns now;
* ``sample_tokens``: the layout adds what its scheduler reads (exact rows: each next window).

A step in which no request holds a window (each decodes AR, or takes an AR step now: the adaptive
window's W 0; none is mid-prefill, no drafts) is vLLM's own AR step, so with exact rows vLLM runs
it whole: its logits rows, its sampler (the same draws, edits, grammars and log-probs) and none of
the layout's host work, which on a host-bound model is most of such a step's time (issue 41).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import SamplerOutput

from vllm_wedlm.adapter.custom_processors import custom_processors, refuse_on_fixed_rows
from vllm_wedlm.adapter.exact_rows import ExactRows
from vllm_wedlm.adapter.fixed_rows import FixedRows
from vllm_wedlm.adapter.grammar_rows import WindowGrammars
from vllm_wedlm.adapter.protocol import RequestRecord, classify, plan_of
from vllm_wedlm.adapter.row_layout import RowLayout
from vllm_wedlm.adapter.step_rows import RequestState
from vllm_wedlm.adapter.vllm_contract import check_runner_attributes
from vllm_wedlm.adapter.window_step import compiled_window_step, fixed_rows_window_step, plain_window_step
from vllm_wedlm.adapter.window_table import WindowTable
from vllm_wedlm.config import WeDLMSettings, max_window_tokens

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


# What ``_calc_spec_decode_metadata`` returns: vLLM's ``_prepare_inputs`` reads only its logits rows.
_NO_SPEC_DECODE_ROWS = SimpleNamespace(logits_indices=None)



def capture_seq_len(num_tokens: int, max_num_seqs: int, max_model_len: int, requested: int | None = None) -> int:
    """The sequence length of every request of a mixed-batch warm-up or graph capture of
    ``num_tokens`` tokens; ``requested``: the length vLLM passes itself (None: its default, N).

    vLLM's ``_dummy_run`` splits a mixed batch of ``num_tokens`` over min(num_tokens, max_num_seqs)
    requests (the last takes the remainder) and gives each a sequence of ``num_tokens`` tokens, or
    of ``requested`` ones. Either can be wrong for a WeDLM engine, whose steps carry up to
    max_num_seqs x 2W tokens:
    - N can exceed ``max_model_len``. Such a sequence reads past its row of the block table
      (``max_model_len`` tokens of blocks), and a FULL capture, whose attention runs on those
      lengths, fails with an illegal memory access.
    - vLLM's graph-memory profile asks for min(max_model_len, max_num_batched_tokens // N), written
      for its own graphs of one-token queries. For a WeDLM capture of 32-token queries that is
      shorter than the query: each request's tokens would not fit its own sequence. (An illegal
      memory access in that profile was seen once with a tiny model in bf16 on an H100; whether
      this was its cause is not known, it did not recur.)
    The capture's lengths only size its work, so the length asked for is kept where it is valid,
    and otherwise moved into the valid range: at least the longest query, at most ``max_model_len``
    unless a query itself is longer.
    """
    requests = min(num_tokens, max_num_seqs)
    longest_query = num_tokens // requests + num_tokens % requests
    asked = num_tokens if requested is None else requested
    return min(max(asked, longest_query), max(max_model_len, longest_query))




class WeDLMRunnerMixin:
    """The WeDLM overrides, on top of vLLM's V1 runner (``GPUModelRunner`` or its CPU subclass).

    A step's WeDLM work is one batched tensor computation for all requests (``core.batch``,
    ``core.sampling``); the host loops over requests only to build the lists vLLM's scheduler reads.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_runner_attributes(self)  # what the adapter reads of vLLM's runner, by name, at start-up
        self.wedlm = WeDLMSettings.from_additional_config(self.vllm_config.additional_config)
        # Custom logits processors (--logits-processors, installed plugins), applied to every row of
        # a step (custom_processors.py); the front end's check misses installed plugins.
        self.wedlm_custom_processors = custom_processors(self.input_batch.logitsprocs)
        if self.wedlm.fixed_window_rows:
            refuse_on_fixed_rows([type(p).__qualname__ for p in self.wedlm_custom_processors])
        self.wedlm_mask_id = int(self.model_config.hf_config.mask_token_id)
        # Every request's record (``protocol.classify``), from its arrival to its end, and its state
        # from its first step (both kept through a preemption: see RequestState).
        self.wedlm_records: dict[str, RequestRecord] = {}
        self.wedlm_requests: dict[str, RequestState] = {}
        # Steps vLLM ran whole (its inputs and sampler), and whether the one in flight is one.
        self.wedlm_vllm_steps = 0
        self.wedlm_vllm_samples = False
        # Plain WeDLM requests with structured outputs decode in windows here (else AR), and the
        # runner follows each one's grammar (grammar_rows.py).
        self.wedlm_grammars = WindowGrammars(self.vllm_config)
        self.wedlm_table = WindowTable(max_window_tokens(self.wedlm.window_size), self.wedlm_mask_id, self.device,
                                       slots=self.max_num_reqs)
        # Windows forwarded since start-up (one per request per step), for tokens-per-forward
        # measurements over a chosen set of requests (``LLM.collective_rpc``, see the workers).
        self.wedlm_request_forwards = 0
        # Steps run per CUDA graph mode ("FULL", "PIECEWISE", "NONE" = eager), start-up included.
        self.wedlm_graph_modes: Counter[str] = Counter()
        # While on (``wedlm_trace_window_sizes``): request id -> the W of each window planned for it,
        # in order (the adaptive window's per-step W, for the reference decoder to replay).
        self.wedlm_window_trace: dict[str, list[int]] | None = None
        # Calls of the layout's window step ("steps") and those that ran compiled code ("compiled").
        self.wedlm_window_step_runs: Counter[str] = Counter()
        # The row layout, chosen once: config_hook chose the scheduler that matches it.
        self.wedlm_rows: RowLayout = (FixedRows(self, fixed_rows_window_step) if self.wedlm.fixed_window_rows
                                      else ExactRows(self, plain_window_step))

    def wedlm_compile_window_step(self) -> None:
        """Compile the layout's window step (``window_step.py``): the GPU worker's, once vLLM has
        compiled the model and captured its graphs."""
        hidden_size = self.model_config.get_hidden_size()

        def logits_of_rows(rows: int) -> torch.Tensor:  # [rows, V], laid out as a step's logits are
            return self.model.compute_logits(torch.zeros(rows, hidden_size, dtype=self.dtype, device=self.device))

        # W reaches the step as a tensor per window (an adaptive window's own): one variant for any W.
        self.wedlm_rows.window_step = compiled_window_step(
            self.wedlm_table, logits_of_rows, (self.wedlm.window_size,), self.max_model_len,
            runs=self.wedlm_window_step_runs,
            fixed_rows=self.wedlm_rows.fixed_rows)

    def _update_states(self, scheduler_output: SchedulerOutput) -> Callable | None:
        if self.wedlm_rows.waits_only(scheduler_output):
            return None
        # Preempted and resumed requests keep their windows (see RequestState). A new request
        # may reuse the id of a finished one (vLLM treats them as two requests).
        stale = set(scheduler_output.finished_req_ids) | {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for req_id in stale:
            self._forget_request(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            self.wedlm_records[new.req_id] = classify(new.sampling_params, self.wedlm)
        return super()._update_states(scheduler_output)

    def _forget_request(self, req_id: str) -> None:
        """The one place a request's record and state go: it finished or was aborted, or a new
        request took its id."""
        self.wedlm_records.pop(req_id, None)
        state = self.wedlm_requests.pop(req_id, None)
        if state is not None:
            self.wedlm_table.release(state.slot)
            self.wedlm_grammars.forget(req_id)

    def _request_state(self, req_id: str) -> RequestState:
        state = self.wedlm_requests.get(req_id)
        if state is None:
            record = self.wedlm_records[req_id]
            if record.windowed and record.grammar:
                sampling = self.requests[req_id].sampling_params
                self.wedlm_grammars.add(req_id, sampling, self.requests[req_id].prompt_token_ids or [])
            state = RequestState(slot=self.wedlm_table.allocate(), record=record,
                                 grammar=req_id in self.wedlm_grammars)
            self.wedlm_table.set_params(state.slot, state.params)
            self.wedlm_requests[req_id] = state
        return state


    def _prepare_inputs(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray):
        prepared = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        stepping_ar = self._step_ar(scheduler_output)
        self.wedlm_vllm_samples = self._hands_step_to_vllm(scheduler_output, stepping_ar)
        if self.wedlm_vllm_samples:
            self.wedlm_vllm_steps += 1
            return prepared  # vLLM's logits rows: each request's last
        return self.wedlm_rows.prepare(scheduler_output, num_scheduled_tokens)

    def _step_ar(self, scheduler_output: SchedulerOutput) -> set[str]:
        """The WeDLM requests that take an AR step now (the adaptive window's W 0,
        ``adapter/window_sizer.py``): each drops the window it held (the step forwards only its
        leading run, and its next window starts after the token drawn now). Its forward is counted
        and, while a trace is on, recorded as W 0: in place of the W its dropped window was planned
        with (that window would have been this forward's), else added."""
        if not self.wedlm_rows.vllm_ar_steps:  # fixed rows: W 0 is a window's own (its run alone)
            return set()
        stepping_ar = {req_id for req_id, window_size in plan_of(scheduler_output).window_sizes.items()
                       if window_size == 0}
        trace = self.wedlm_window_trace
        for req_id in stepping_ar:
            state = self._request_state(req_id)
            if trace is not None:
                sizes = trace.setdefault(req_id, [])
                if state.has_window and sizes:
                    sizes[-1] = 0
                else:
                    sizes.append(0)
            state.has_window = False
        self.wedlm_request_forwards += len(stepping_ar)
        return stepping_ar

    def _hands_step_to_vllm(self, scheduler_output: SchedulerOutput, stepping_ar: set[str]) -> bool:
        """Whether vLLM runs this step as its own AR step: the layout lets it (``RowLayout.vllm_ar_steps``),
        no request of the step decodes in windows (each is decoded AR or takes an AR step now,
        ``stepping_ar``), no drafts are scheduled, and every request forwards up to its last token, so
        each draws one token from its last row as vLLM's sampler would. (A prefill chunk's draw vLLM
        discards, rewinding its generator, which a CPU generator cannot: the layout draws nothing for
        it.)"""
        num_reqs = self.input_batch.num_reqs
        return (self.wedlm_rows.vllm_ar_steps and not scheduler_output.scheduled_spec_decode_tokens
                and all(req_id in stepping_ar or not self.wedlm_records[req_id].windowed
                        for req_id in scheduler_output.num_scheduled_tokens)
                and not self.discard_request_mask.np[:num_reqs].any())

    def _prepare_input_ids(self, *args, **kwargs):
        self.wedlm_rows.before_input_ids()
        return super()._prepare_input_ids(*args, **kwargs)

    def _calc_spec_decode_metadata(self, num_draft_tokens: np.ndarray, cu_num_scheduled_tokens: np.ndarray):
        # vLLM's speculative-decoding rows (each request's drafts plus a bonus row), device tensors
        # built by its ``_prepare_inputs`` for a step with drafts; ours replaces them with the WeDLM
        # step's own logits rows, so they are not built.
        return _NO_SPEC_DECODE_ROWS

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata) -> SamplerOutput:
        if self.wedlm_vllm_samples:
            return super()._sample(logits, spec_decode_metadata)
        return self.wedlm_rows.sample(logits)

    def _dummy_run(self, num_tokens: int, *args, **kwargs):
        # Warm-up and graph capture: mixed batches get sequences that fit the block table and hold their queries.
        if not (kwargs.get("uniform_decode") or kwargs.get("create_mixed_batch")):
            kwargs["profile_seq_lens"] = capture_seq_len(num_tokens, self.scheduler_config.max_num_seqs,
                                                         self.max_model_len, kwargs.get("profile_seq_lens"))
        return super()._dummy_run(num_tokens, *args, **kwargs)

    def _determine_batch_execution_and_padding(self, *args, **kwargs):
        decision = super()._determine_batch_execution_and_padding(*args, **kwargs)
        self.wedlm_graph_modes[decision[0].name] += 1
        return decision

    def initialize_metadata_builders(self, *args, **kwargs) -> None:
        super().initialize_metadata_builders(*args, **kwargs)
        for groups in self.attn_groups:
            for group in groups:
                for builder in group.metadata_builders:
                    if getattr(builder, "aot_schedule", False) and getattr(builder, "use_full_cuda_graph", False):
                        # FlashAttention 3 with FULL graphs: vLLM computes the kernel's tile schedule
                        # on the host each step, from that step's longest query, and the graph replays
                        # the kernel captured for its batch's longest query. A WeDLM engine replays its
                        # mixed-batch graphs for every step, and where the two lengths differ the
                        # schedule need not fit the kernel: at one token per request (AR-decoded
                        # requests alone; vLLM's own V1 runner with cudagraph_mode FULL too) the
                        # tokens were wrong (lab notebook 5.13). Without it, FlashAttention computes
                        # the schedule inside the graph, from the kernel's own arguments. Its split
                        # bound (max_num_splits), set for graphs, stays.
                        builder.aot_schedule = False

    def _bookkeeping_sync(self, *args, **kwargs):
        # vLLM rewinds the generator of a discarded (partial-prefill) row by one draw; WeDLM drew
        # nothing for it, and CPU generators have no offset to rewind.
        generators, self.input_batch.generators = self.input_batch.generators, {}
        if self.use_async_scheduling and self.input_batch.prev_sampled_token_ids is None:
            # Async bookkeeping keeps one draw per request for the next input ids, which a window
            # step does not read (_prepare_input_ids): any [B, 1] tensor passes its check.
            sampler_output = kwargs.get("sampler_output", args[1] if len(args) > 1 else None)
            self.input_batch.prev_sampled_token_ids = sampler_output.sampled_token_ids[:, :1]
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            self.input_batch.generators = generators

    def sample_tokens(self, grammar_output):
        # vLLM would apply the grammar masks at its own rows (one per request, plus its drafts');
        # the layout applies them at the structured-output requests' rows of a WeDLM step.
        if self.wedlm_vllm_samples:  # vLLM's own AR step: its grammar masks too
            output = super().sample_tokens(grammar_output)
            self.wedlm_vllm_samples = False
            self.wedlm_rows.vllm_sampled()
            return self.wedlm_rows.runner_output(output)
        self.wedlm_rows.grammar_output = grammar_output
        return self.wedlm_rows.runner_output(super().sample_tokens(None))


class WeDLMWorkerMixin:
    """What the WeDLM CPU and GPU workers add to vLLM's, callable through ``LLM.collective_rpc``."""

    def wedlm_request_forwards(self) -> int:
        """Windows forwarded so far: ``llm.collective_rpc("wedlm_request_forwards")``."""
        return self.model_runner.wedlm_request_forwards

    def wedlm_mask_id(self) -> int:
        """The mask token id the runner fills windows with: ``llm.collective_rpc("wedlm_mask_id")``."""
        return self.model_runner.wedlm_mask_id

    def wedlm_vllm_steps(self) -> int:
        """Steps vLLM ran as its own AR steps (no request of the engine in windows):
        ``llm.collective_rpc("wedlm_vllm_steps")``."""
        return self.model_runner.wedlm_vllm_steps

    def wedlm_graph_modes(self) -> dict[str, int]:
        """Steps run per CUDA graph mode so far: ``llm.collective_rpc("wedlm_graph_modes")``."""
        return dict(self.model_runner.wedlm_graph_modes)

    def wedlm_window_steps(self) -> dict[str, int]:
        """Steps of plain windows so far whose device work ran compiled and eagerly (the GPU worker
        compiles it; a variant start-up missed runs eagerly): ``llm.collective_rpc("wedlm_window_steps")``."""
        runs = self.model_runner.wedlm_window_step_runs
        return {"compiled": runs["compiled"], "eager": runs["steps"] - runs["compiled"]}

    def wedlm_row_layouts(self) -> dict[str, int]:
        """Fixed window rows: steps so far whose windows the scheduler's gate padded to their longest
        possible run ("padded": 2W rows at a fixed W, pipelined) and the others ("exact"), windows
        void for a step ("void_windows"), steps that scheduled nothing, only waiting for the one
        in flight ("waits"), and windows of W 0 re-prefilled after a preemption, which drew from
        their last row ("w0_redrawn"):
        ``llm.collective_rpc("wedlm_row_layouts")``."""
        return self.model_runner.wedlm_rows.counts()

    def wedlm_trace_window_sizes(self, on: bool) -> dict[str, list[int]]:
        """Start (``on``) or stop recording the window size W of every window planned, per request
        (vLLM's internal request id), and return what was recorded since the last call:
        ``llm.collective_rpc("wedlm_trace_window_sizes", args=(True,))``. For checks of the
        adaptive window (``--wedlm-window-tokens``) against the reference decoder run at the same W."""
        runner = self.model_runner
        trace, runner.wedlm_window_trace = runner.wedlm_window_trace or {}, ({} if on else None)
        return trace
