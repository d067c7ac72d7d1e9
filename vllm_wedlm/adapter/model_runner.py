"""The WeDLM overrides of vLLM's V1 model runner, shared by the CPU and GPU workers.

Per step and request, the scheduler hands over either a prefill chunk or a window: its leading
filled run (tokens already returned to vLLM as output, not yet forwarded) followed by its "draft"
tokens, the rest of the window, in the physical order this runner planned. A plain request's first
window usually comes as drafts after its prompt's last chunk (its masks, planned here). The
overrides, in the order vLLM calls them:

* ``_update_states``: forget the window of finished and new requests. A preempted request keeps
  its window (filled, unforwarded slots included): vLLM re-prefills its tokens, some steps later
  and perhaps in chunks, and the window resumes exactly where it stopped;
* ``_prepare_inputs``: plan the first windows that came with a prompt; after vLLM computed slots
  from physical positions, rewrite the RoPE positions of window tokens to their logical ones, and
  ask for the logits of mask rows only;
* ``_sample``: run ``core`` (entropy, selection, sampling, commit, refill) instead of vLLM's
  sampler. A step's sampled tokens are each next window's leading filled run: every slot before
  them is decided, so they are returned as soon as they are known, one forward before the forward
  that writes their KV (the same lag as an AR token, streamed the step it is drawn). A prefill
  without a window samples none and, once complete, schedules the request's first window (where
  it could not ride with the prompt) or the one it had when it was preempted. Lossless windows
  return their run once verified, when their KV is written;
* ``sample_tokens``: attach each request's next window to the output for the scheduler.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.outputs import WeDLMRunnerOutput
from vllm_wedlm.adapter.window_step import (
    check_rows,
    compiled_window_step,
    fixed_rows_window_step,
    leading_runs,
    plain_window_step,
    plan_rows,
)
from vllm_wedlm.adapter.window_table import WindowTable, packet_width
from vllm_wedlm.config import WeDLMSettings, max_window_tokens, request_decoding
from vllm_wedlm.core.batch import (
    WindowBatch,
    drop_leading,
    finish_windows,
    leading_filled,
    plan_windows,
    verification_drafts,
    verify_windows,
)
from vllm_wedlm.core.params import WeDLMParams
from vllm_wedlm.core.sampling import SamplingBatch, accept_drafts, sample
from vllm_wedlm.core.selection import row_entropy

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


@dataclass
class RequestState:
    """The runner's state of one request in WeDLM mode, kept from its first step to its end.

    vLLM's scheduler knows a window only as the request's output tokens not yet forwarded (its
    leading filled run) and its draft tokens; it drops the drafts when it preempts the request
    (and sets ``num_computed_tokens`` to 0), while the output tokens stay in the request and are
    re-prefilled. So the window (tokens, which slots are filled, its physical order) lives in the
    runner's ``WindowTable`` at ``slot`` and survives preemption: the next forward after the
    re-prefill is the one the request would have run without it, so its output does not depend on
    preemption.
    """

    slot: int
    params: WeDLMParams
    has_window: bool = False  # a window is planned at ``slot`` (its input ids went out as drafts)
    # A request that asked for ``wedlm_decoding: "ar"``: no window. Each step forwards the tokens
    # it has not forwarded yet (its prompt, then the token drawn last step) and draws the next
    # token from the last row, as vLLM's own sampler does in --decoding ar.
    autoregressive: bool = False


@dataclass
class StepRows:
    """What each request of the input batch does in the current step ([B] arrays, batch order)."""

    req_ids: list[str]
    slots: np.ndarray  # int64, WindowTable slot
    autoregressive: np.ndarray  # bool: a request decoded AR on this engine (wedlm_decoding: ar)
    window: np.ndarray  # bool: forwards its WeDLM window
    completes_prefill: np.ndarray  # bool: forwards up to the request's last token, no window
    lossless: np.ndarray  # bool: a WeDLM request whose fills are verified (WeDLMParams.lossless)
    ar_next: np.ndarray  # bool: draws the next token from its last row (AR requests, every full step)
    first_token: np.ndarray  # bool: a lossless request draws its first token from the prompt's last row
    committed_len: np.ndarray  # int64: tokens with exact KV once this step's prefill chunk is in
    num_logits: np.ndarray  # int64: logits rows: num_checks first rows, then the request's last ones
    num_checks: np.ndarray  # int64: a lossless window's verification rows (its leading run, first rows)

    @property
    def num_ar_rows(self) -> np.ndarray:
        """[B] int64: next-token rows among each request's logits rows (the first ones)."""
        return self.num_checks + (self.ar_next | self.first_token)


# What a logits row of a step is for.
_MASK_ROW = 0  # a window's mask row: entropy and a draw for the fill
_CHECK_ROW = 1  # a lossless window's leading-run row: checks the next fill (core.sampling.verify)
_AR_NEXT_ROW = 2  # an AR-decoded request's next token (its last row)
_FIRST_TOKEN_ROW = 3  # a lossless request's first token (the prompt's last row): its window's slot 0


# What ``_calc_spec_decode_metadata`` returns: vLLM's ``_prepare_inputs`` reads only its logits rows.
_NO_SPEC_DECODE_ROWS = SimpleNamespace(logits_indices=None)


def _only_waits(scheduler_output: SchedulerOutput) -> bool:
    """Whether a step schedules nothing and changes no request (a step of async scheduling that
    only waits for the one in flight)."""
    return not (scheduler_output.total_num_scheduled_tokens or scheduler_output.finished_req_ids
                or scheduler_output.preempted_req_ids or scheduler_output.free_encoder_mm_hashes
                or scheduler_output.new_block_ids_to_zero or scheduler_output.kv_cache_block_copies)


def _ragged_arange(counts: np.ndarray) -> np.ndarray:
    """[sum(counts)] int64: 0..counts[0]-1, 0..counts[1]-1, ... (the index inside each segment)."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


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
    ``core.sampling``) and one device-to-host copy; the host loops over requests only to build
    the lists vLLM's scheduler reads.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wedlm = WeDLMSettings.from_additional_config(self.vllm_config.additional_config)
        self.wedlm_mask_id = int(self.model_config.hf_config.mask_token_id)
        self.wedlm_requests: dict[str, RequestState] = {}
        self.wedlm_table = WindowTable(max_window_tokens(self.wedlm.window_size), self.wedlm_mask_id, self.device,
                                       slots=self.max_num_reqs)
        self._wedlm_step: StepRows | None = None
        # Fixed window rows: the step's windows' slots, leading runs, starts and rows (device, [Bw]
        # each), and whether all forwarded 2W rows.
        self._wedlm_fixed: tuple = ()
        self._wedlm_next_windows: dict[str, list[int]] = {}
        self._wedlm_unforwarded: dict[str, int] = {}
        # Windows forwarded since start-up (one per request per step), for tokens-per-forward
        # measurements over a chosen set of requests (``LLM.collective_rpc``, see the workers).
        self.wedlm_request_forwards = 0
        # Steps run per CUDA graph mode ("FULL", "PIECEWISE", "NONE" = eager), start-up included.
        self.wedlm_graph_modes: Counter[str] = Counter()
        # While on (``wedlm_trace_window_sizes``): request id -> the W of each window planned for it,
        # in order (the adaptive window's per-step W, for the reference decoder to replay).
        self.wedlm_window_trace: dict[str, list[int]] | None = None
        # A step of plain windows' device work (compiled by the GPU worker, see window_step.py);
        # "steps" counts its calls, "compiled" those that ran compiled code.
        self.wedlm_window_step: Callable = plain_window_step
        self.wedlm_fixed_rows_step: Callable = fixed_rows_window_step  # the same, with fixed window rows
        self.wedlm_window_step_runs: Counter[str] = Counter()
        # Fixed window rows: steps whose windows all forwarded 2W rows ("padded") and the others
        # ("exact": the scheduler's gate chose each window's own rows, or a predicted run's), and
        # the windows that were void for a step (their run outgrew the prediction), on the device.
        self.wedlm_row_layouts: Counter[str] = Counter()
        self.wedlm_void_windows = torch.zeros((), dtype=torch.long, device=self.device)
        # Fixed window rows: each AR-decoded request's last draw, per slot (the next step's input).
        self._wedlm_ar_draws = torch.zeros(self.max_num_reqs, dtype=torch.long, device=self.device)

    def wedlm_compile_window_step(self) -> None:
        """Compile the step of plain windows (``window_step.py``): the GPU worker's, once vLLM has
        compiled the model and captured its graphs; with fixed window rows, their step."""
        hidden_size = self.model_config.get_hidden_size()

        def logits_of_rows(rows: int) -> torch.Tensor:  # [rows, V], laid out as a step's logits are
            return self.model.compute_logits(torch.zeros(rows, hidden_size, dtype=self.dtype, device=self.device))

        window_sizes = {self.wedlm.window_size}
        if self.wedlm.window_tokens is not None:
            window_sizes.add(1)  # the adaptive window may shrink to 1, a variant of its own
        step = compiled_window_step(self.wedlm_table, logits_of_rows, window_sizes, self.max_model_len,
                                    runs=self.wedlm_window_step_runs, fixed_rows=self.wedlm.fixed_window_rows)
        if self.wedlm.fixed_window_rows:
            self.wedlm_fixed_rows_step = step
        else:
            self.wedlm_window_step = step

    def _update_states(self, scheduler_output: SchedulerOutput) -> Callable | None:
        if self.wedlm.fixed_window_rows and _only_waits(scheduler_output):
            # Async scheduling's step that waits for the one in flight (the scheduler's gate holds
            # its windows back): vLLM would take every request out of the persistent batch, as
            # unscheduled, only to add them all again next step (host work that grows with the batch).
            return None
        # Preempted and resumed requests keep their windows (see RequestState). A new request
        # may reuse the id of a finished one (vLLM treats them as two requests).
        stale = set(scheduler_output.finished_req_ids) | {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for req_id in stale:
            state = self.wedlm_requests.pop(req_id, None)
            if state is not None:
                self.wedlm_table.release(state.slot)
        return super()._update_states(scheduler_output)

    def _request_state(self, req_id: str) -> RequestState:
        state = self.wedlm_requests.get(req_id)
        if state is None:
            extra_args = self.requests[req_id].sampling_params.extra_args
            state = RequestState(slot=self.wedlm_table.allocate(), params=self.wedlm.request_params(extra_args),
                                 autoregressive=request_decoding(extra_args) == "ar")
            self.wedlm_table.set_params(state.slot, state.params)
            self.wedlm_requests[req_id] = state
        return state

    def _prepare_inputs(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray):
        if self.wedlm.fixed_window_rows:
            return self._prepare_fixed_rows(scheduler_output, num_scheduled_tokens)
        super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        num_reqs = self.input_batch.num_reqs
        req_ids = self.input_batch.req_ids[:num_reqs]
        states = [self._request_state(req_id) for req_id in req_ids]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        slots = np.fromiter((s.slot for s in states), np.int64, num_reqs)  # [B]
        autoregressive = np.fromiter((s.autoregressive for s in states), bool, num_reqs)  # [B]
        scheduled_drafts = np.fromiter((req_id in drafts for req_id in req_ids), bool, num_reqs)  # [B]
        n = num_scheduled_tokens[:num_reqs].astype(np.int64)  # [B] tokens forwarded
        starts = self.query_start_loc.np[:num_reqs].astype(np.int64)  # [B]
        computed = self.input_batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)  # [B]
        host = self.wedlm_table.host

        window = scheduled_drafts & ~autoregressive
        ar_drafts = scheduled_drafts & autoregressive
        if ar_drafts.any():
            row = int(np.argmax(ar_drafts))
            raise RuntimeError(f"AR request {req_ids[row]} on a WeDLM engine got draft tokens")
        uncomputed = self.input_batch.num_tokens_no_spec[:num_reqs] - computed  # [B]: prompt or leading run
        # A first window, scheduled with the prompt's last rows (adapter/scheduler.py): planned now.
        first = window & ~np.fromiter((s.has_window for s in states), bool, num_reqs)  # [B]
        if first.any():
            self._start_windows(req_ids, states, first, computed + uncomputed)
        prompt_rows = np.where(first, uncomputed, 0)  # [B] rows before each window: a first window's prompt
        wrong = window & (n != prompt_rows + host.length[slots])
        if wrong.any():
            row = int(np.argmax(wrong))
            raise RuntimeError(
                f"WeDLM request {req_ids[row]}: {n[row] - prompt_rows[row]} tokens scheduled for a window of "
                f"{host.length[slots[row]]}; the token budget must fit every running window "
                "(max_num_batched_tokens >= max_num_seqs * 2 * window_size)")
        completes_prefill = ~scheduled_drafts & (computed + n >= self.input_batch.num_tokens_no_spec[:num_reqs])
        # An AR request draws its next token whenever it forwarded all its tokens (its prompt's
        # last row first, then each last drawn token's), as vLLM's sampler would.
        ar_next = completes_prefill & autoregressive
        # A lossless request draws its first token from the prompt's last row too; after a
        # preemption it already holds it in its window.
        lossless = np.fromiter((s.params.lossless for s in states), bool, num_reqs) & ~autoregressive  # [B]
        first_token = completes_prefill & lossless
        if first_token.any():
            first_token &= np.fromiter((not s.has_window for s in states), bool, num_reqs)
        # Logits rows: a lossless window's leading run (its first rows, checked against the AR
        # prediction), then each request's last rows (a window's masks; an AR request's next token).
        num_checks = np.where(window & lossless, host.num_commit[slots], 0)  # [B]
        num_last = np.where(window, host.num_masks[slots], (ar_next | first_token).astype(np.int64))  # [B]
        num_logits = num_checks + num_last

        # RoPE positions: physical (computed + i) everywhere but in windows, whose row i holds slot
        # order[i] at logical position start + order[i] (start: where the window begins, after a
        # first window's prompt rows). vLLM computed the KV slots from the physical positions; only
        # RoPE sees the logical ones.
        intra = _ragged_arange(n)  # [T]
        positions = np.repeat(computed, n) + intra  # [T]
        row_in_window = intra - np.repeat(prompt_rows, n)  # [T]
        in_window = np.repeat(window, n) & (row_in_window >= 0)  # [T]
        positions[in_window] = (np.repeat(computed + prompt_rows, n)[in_window]
                                + host.order[np.repeat(slots, n)[in_window], row_in_window[in_window]])
        total = len(positions)
        self.positions[:total].copy_(torch.from_numpy(positions), non_blocking=True)  # in place: graphs read it

        self._wedlm_step = StepRows(list(req_ids), slots, autoregressive, window, completes_prefill, lossless,
                                    ar_next, first_token, computed + n, num_logits, num_checks)
        k = _ragged_arange(num_logits)  # [N] row index inside each request's logits
        first_rows = np.repeat(starts, num_logits) + k
        last_rows = np.repeat(starts + n - num_logits, num_logits) + k
        indices = np.where(k < np.repeat(num_checks, num_logits), first_rows, last_rows)
        return torch.from_numpy(indices).to(self.device, non_blocking=True), None

    def _prepare_fixed_rows(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray):
        """``_prepare_inputs`` with fixed window rows (``config.FIXED_ROWS_KEY``): each window's rows, up
        to Q = 2W, are laid out from the device table (the host may not know the window yet, when the
        step before is still running). Its logits rows are R per window (``_logits_rows_per_window``):
        a plain window's R after its leading run, which hold every mask row unless the window is void
        (given fewer rows than it has, for a run longer than the scheduler predicted:
        ``fixed_rows_window_step``); a lossless window's first R, its whole window (the scheduler gives
        it Q rows). Then the last row of each request that draws a next token: an AR-decoded one
        (``_ar_input_ids``), and a lossless one whose prompt ended (its window's slot 0)."""
        super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        num_reqs = self.input_batch.num_reqs
        req_ids = self.input_batch.req_ids[:num_reqs]
        states = [self._request_state(req_id) for req_id in req_ids]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        slots = np.fromiter((s.slot for s in states), np.int64, num_reqs)  # [B]
        autoregressive = np.fromiter((s.autoregressive for s in states), bool, num_reqs)  # [B]
        lossless = np.fromiter((s.params.lossless for s in states), bool, num_reqs) & ~autoregressive  # [B]
        window = np.fromiter((req_id in drafts for req_id in req_ids), bool, num_reqs)  # [B]
        has_window = np.fromiter((s.has_window for s in states), bool, num_reqs)  # [B]
        n = num_scheduled_tokens[:num_reqs].astype(np.int64)  # [B] rows forwarded
        starts = self.query_start_loc.np[:num_reqs].astype(np.int64)  # [B]
        computed = self.input_batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64)  # [B], a bound in a window
        num_drafts = np.fromiter((len(drafts.get(req_id, ())) for req_id in req_ids), np.int64, num_reqs)
        first = window & ~has_window  # [B]: a first window, after its prompt's last rows
        prompt_rows = np.where(first, n - num_drafts, 0)  # [B]
        if first.any():
            self._start_windows(req_ids, states, first, computed + prompt_rows)
        if (window & autoregressive).any():
            raise RuntimeError(f"AR request {req_ids[int(np.argmax(window & autoregressive))]} on a WeDLM engine "
                               "got draft tokens")
        completes_prefill = ~window & (computed + n >= self.input_batch.num_tokens_no_spec[:num_reqs])
        ar_next = completes_prefill & autoregressive  # [B] draws its next token from its last row
        first_token = completes_prefill & lossless & ~has_window  # [B] draws its window's slot 0 from its last row
        rows_per_window = self._logits_rows_per_window(window & lossless)
        self._wedlm_step = StepRows(list(req_ids), slots, autoregressive, window, completes_prefill, lossless,
                                    ar_next, first_token, computed + n,
                                    np.where(window, rows_per_window, (ar_next | first_token).astype(np.int64)),
                                    np.zeros(num_reqs, np.int64))
        ar_rows = self._ar_input_ids(req_ids, slots, autoregressive, ar_next | first_token, starts, n)  # [Bd] device
        b = np.flatnonzero(window)  # [Bw] batch rows of windows
        if not len(b):
            return ar_rows, None
        table = self.wedlm_table
        rows = n[b] - prompt_rows[b]  # [Bw] window rows: Q when pipelined, else each window's own
        q = max_window_tokens(self.wedlm.window_size)
        for i in np.flatnonzero(rows > q):
            # The layout below indexes the table by these rows on the device: say which request,
            # rather than a device-side index assert later.
            raise RuntimeError(f"WeDLM request {req_ids[b[i]]}: {rows[i]} window rows scheduled, more than "
                               f"2W = {q} (fixed window rows)")
        padded = True  # every window 2W rows, none void
        if has_window[b].any():  # a first window forwards its W masks after the prompt either way
            padded = (rows[has_window[b]] == q).all()
            self.wedlm_row_layouts["padded" if padded else "exact"] += 1
        first_row = starts[b] + prompt_rows[b]  # [Bw] each window's first row in the step
        row_of = np.repeat(np.arange(len(b)), rows)  # [Tw] which window each window row is of
        # One copy: each window's slot, batch row, first row, rows, prompt rows, whether lossless;
        # each window row's index and window.
        head = np.stack([slots[b], b, first_row, rows, prompt_rows[b], lossless[b]])
        index = torch.from_numpy(np.concatenate([head.ravel(), np.repeat(first_row, rows) + _ragged_arange(rows),
                                                 row_of])).to(self.device, non_blocking=True)
        w_slots, w_batch, w_first, w_rows, w_prompt, w_lossless = index[: 6 * len(b)].view(6, len(b))
        flat_rows, flat_window = index[6 * len(b):].view(2, -1)
        flat_i = flat_rows - w_first[flat_window]  # [Tw] physical row inside its window
        start = table.committed_len[w_slots]  # [Bw] tokens before each window (its KV frontier)
        # Physical positions (KV slots) from the window's real start, then RoPE's logical ones.
        self.num_computed_tokens[w_batch] = (start - w_prompt).to(self.num_computed_tokens.dtype)
        total = scheduler_output.total_num_scheduled_tokens
        self.positions[:total] = (self.num_computed_tokens[self.req_indices.gpu[:total]].to(torch.int64)
                                  + self.query_pos.gpu[:total])
        self.seq_lens[:num_reqs] = self.num_computed_tokens[:num_reqs] + self.num_scheduled_tokens.gpu[:num_reqs]
        self.input_batch.block_table.compute_slot_mapping(num_reqs, self.query_start_loc.gpu[: num_reqs + 1],
                                                          self.positions[:total])
        order = table.order[w_slots[flat_window], flat_i]  # [Tw] the slot fed at each window row
        self.positions[flat_rows] = start[flat_window] + order
        self.input_ids.gpu[flat_rows] = table.windows.tokens[w_slots[flat_window], order].to(self.input_ids.gpu.dtype)
        # Logits: R rows of each window, in physical order: a plain window's after its leading run
        # (its masks are among them), a lossless window's from its first (its leading run checks).
        run = leading_filled(table.windows.filled[w_slots])  # [Bw]
        w_lossless = w_lossless.bool() if (window & lossless).any() else None  # [Bw]
        from_row = run if w_lossless is None else torch.where(w_lossless, 0, run)  # [Bw]
        k = torch.arange(rows_per_window, device=self.device)[None]  # [1, R]
        logits_rows = w_first[:, None] + torch.minimum(from_row[:, None] + k, w_rows[:, None] - 1)  # [Bw, R]
        self._wedlm_fixed = (w_slots, run, start, w_rows, padded, w_lossless)
        return torch.cat([logits_rows.flatten(), ar_rows]), None

    def _logits_rows_per_window(self, lossless_windows: np.ndarray) -> int:
        """R, the logits rows of every window of a fixed-rows step: the most undecided slots a window
        has (the server's W; an adaptive window's is at most that), or, in a step with a lossless
        window ([B] bool), the most rows a window has (2W), which its verification reads."""
        window_size = self.wedlm.window_size
        return max_window_tokens(window_size) if lossless_windows.any() else window_size

    def _ar_input_ids(self, req_ids: list[str], slots: np.ndarray, autoregressive: np.ndarray, draws: np.ndarray,
                      starts: np.ndarray, n: np.ndarray) -> torch.Tensor:
        """Fixed window rows: the logits rows of the requests that draw a next token this step (``draws``
        [B] bool, an AR-decoded request's or a lossless request's first), the last row of each ([Bd]
        device row indices), and the input ids of AR-decoded requests ([B] bool ``autoregressive``).

        Under async scheduling vLLM keeps a request's draw on the device and its host copy of the
        tokens holds -1 there; its own scatter of the last step's draws is off with fixed rows
        (``_prepare_input_ids``). An AR request's row that holds -1 is its last draw, kept on the
        device per slot (``_wedlm_ar_draws``, written by the step that drew it). vLLM sends the
        real tokens of a request that skipped a step, so -1 is only ever its last row."""
        if not draws.any():  # the usual step: no scan of its rows, no copy
            return torch.zeros(0, dtype=torch.long, device=self.device)
        rows = starts[draws] + n[draws] - 1  # [Bd]
        stale = np.zeros(0, np.int64)
        if autoregressive.any():
            batch_row = np.repeat(np.arange(len(n)), n)  # [T] the request of each row
            stale = np.flatnonzero(autoregressive[batch_row] & (self.input_ids.np[: len(batch_row)] < 0))  # [S]
            unknown = stale[~np.isin(stale, rows)]
            if len(unknown):
                raise RuntimeError(f"AR request {req_ids[batch_row[unknown[0]]]}: an input token is known neither "
                                   "on the host nor on the device")
            stale_slots = slots[batch_row[stale]]
        index = torch.from_numpy(np.concatenate([rows, stale, stale_slots if len(stale) else stale])).to(
            self.device, non_blocking=True)
        if len(stale):
            self.input_ids.gpu[index[len(rows): len(rows) + len(stale)]] = (
                self._wedlm_ar_draws[index[len(rows) + len(stale):]].to(self.input_ids.gpu.dtype))
        return index[: len(rows)]

    def _prepare_input_ids(self, *args, **kwargs):
        if self.wedlm.fixed_window_rows:
            # Async scheduling keeps the last step's draws on the device to scatter them into the
            # next input ids; a window's rows come from the table instead (_prepare_fixed_rows).
            self.input_batch.prev_sampled_token_ids = None
        return super()._prepare_input_ids(*args, **kwargs)

    def _sample_fixed_rows(self, logits: torch.Tensor | None) -> SamplerOutput:
        """``_sample`` with fixed window rows, with no device-to-host copy: finish the forwarded windows
        from their R logits rows each, plan every next window (also the first one after a prompt, and
        a preempted request's after its re-prefill) into the table, and return what each window
        returns now (``fixed_rows_window_step``), padded with -1, as the step's sampled tokens (a
        device tensor); an AR-decoded request's draw is its first column."""
        step, table, mask_id = self._wedlm_step, self.wedlm_table, self.wedlm_mask_id
        num_reqs = len(step.req_ids)
        states = [self.wedlm_requests[req_id] for req_id in step.req_ids]
        has_window = np.fromiter((s.has_window for s in states), bool, num_reqs)
        windowed = step.completes_prefill & ~step.autoregressive
        new = windowed & ~has_window  # [B] first window after the prompt
        resumed = windowed & has_window  # [B] re-prefilled after a preemption
        window_rows = np.flatnonzero(step.window)  # [Bw]
        # W of every window planned now (an adaptive window's follows the step's count of them).
        window_size = self.wedlm.step_window_size(len(window_rows) + int(new.sum()))
        rows_per_window = self._logits_rows_per_window(step.window & step.lossless)
        width = max(2, rows_per_window)
        sampled = None  # [Bw, width] int32: what each window returns now
        num_window_logits = len(window_rows) * rows_per_window  # the first logits rows; then the draws' rows
        if step.window.any():
            w_slots, run, start, rows, padded, w_lossless = self._wedlm_fixed
            self.wedlm_request_forwards += len(window_rows)
            window_logits = logits[:num_window_logits]
            sampling = self._sampling_batch(np.where(step.window, rows_per_window, 0), np.zeros(num_reqs, np.int64))
            tokens = None  # greedy: drawn inside the step
            if sampling.temperature is not None:
                if w_lossless is not None:  # a lossless window's leading-run rows are AR rows: no mask ban
                    ban = ~check_rows(w_lossless, run, rows_per_window).flatten()  # [Bw * R]
                    sampling = dataclasses.replace(sampling, ban_mask_token=ban)
                tokens = sample(window_logits, sampling, mask_id)
            self.wedlm_window_step_runs["steps"] += 1
            *windows, order, committed_len, sampled, void = self.wedlm_fixed_rows_step(
                table.windows, table.order, w_slots, window_logits, tokens, run, start, rows, table.entropy_threshold,
                table.pos_penalty, window_size, self.max_model_len, mask_id, rows_per_window, w_lossless)
            table.keep(w_slots, WindowBatch(*windows), order, committed_len)
            if not padded:  # some windows got a predicted run's rows: count the void ones (no host sync)
                self.wedlm_void_windows = self.wedlm_void_windows + void.sum()
        if len(window_rows) < num_reqs or sampled is None:  # not every request forwarded a window
            every = torch.full((num_reqs, width), -1, dtype=torch.int32, device=self.device)
            draw_rows = np.flatnonzero(step.ar_next | step.first_token)  # [Bd]
            ar_rows = np.flatnonzero(step.ar_next)  # [Ba]
            index = torch.from_numpy(np.concatenate([window_rows, ar_rows, step.slots[ar_rows]])).to(
                self.device, non_blocking=True)
            if sampled is not None:
                every[index[: len(window_rows)]] = sampled
            first_tokens = None
            if len(draw_rows):
                # Each next token from its request's last row (no mask ban), as vLLM's sampler draws it.
                draws = (step.ar_next | step.first_token).astype(np.int64)
                drawn = sample(logits[num_window_logits:], self._sampling_batch(draws, draws), mask_id)  # [Bd]
                is_ar = step.ar_next[draw_rows]  # [Bd]
                if is_ar.all():
                    ar_drawn = drawn
                else:
                    ar_drawn = self._rows(drawn, is_ar)
                    first_tokens = self._rows(drawn, ~is_ar)  # [new lossless], in batch order
                if len(ar_rows):
                    every[index[len(window_rows): len(window_rows) + len(ar_rows)], 0] = ar_drawn.to(torch.int32)
                    self._wedlm_ar_draws[index[len(window_rows) + len(ar_rows):]] = ar_drawn
            sampled = every
            self._start_after_prefill(step, new, resumed, sampled, window_size, first_tokens)
        planned_afresh = np.flatnonzero(step.window | new)  # [P - resumed] batch rows
        for row in planned_afresh:
            states[row].has_window = True
        if self.wedlm_window_trace is not None:
            for row in planned_afresh:
                self.wedlm_window_trace.setdefault(step.req_ids[row], []).append(window_size)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)

    def _start_after_prefill(self, step: StepRows, new: np.ndarray, resumed: np.ndarray, sampled: torch.Tensor,
                             window_size: int, first_tokens: torch.Tensor | None) -> None:
        """Fixed window rows: plan the windows of the ``new`` ([B] bool) requests, whose prompt ended
        this step, and of the ``resumed`` plain ones, re-prefilled after a preemption, into the table,
        and write each plain one's leading run into its row of ``sampled`` ([B, width]).

        A new lossless window starts with its slot 0 filled by ``first_tokens`` ([new lossless], batch
        order), the draw of its prompt's last row, and returns nothing before that slot's KV is
        written. A resumed lossless window is kept as it was: it had returned only tokens whose KV
        was written, which the re-prefill wrote again, so it starts where it did."""
        table, mask_id = self.wedlm_table, self.wedlm_mask_id
        resumed = resumed & ~step.lossless
        num_new, num_resumed = int(new.sum()), int(resumed.sum())
        if not num_new + num_resumed:
            return
        new_lossless = step.lossless[new]  # [num_new]
        host = torch.from_numpy(np.concatenate([step.slots[new], step.slots[resumed], step.committed_len[new],
                                                np.flatnonzero(new), np.flatnonzero(resumed),
                                                np.flatnonzero(new_lossless)]))
        new_slots, resumed_slots, new_starts, rows, lossless_index = host.to(self.device, non_blocking=True).split(
            [num_new, num_resumed, num_new, num_new + num_resumed, int(new_lossless.sum())])
        parts, starts, sizes = [], [], []
        if num_new:
            fresh = WindowBatch.empty(num_new, table.capacity, mask_id, self.device)
            if new_lossless.any():
                fresh.tokens[lossless_index, 0] = first_tokens
                fresh.filled[lossless_index, 0] = True
            parts.append(fresh)
            starts.append(new_starts)  # after the prompt
            sizes.append(torch.full_like(new_slots, window_size))
        if num_resumed:
            # Its leading run went back as output before the preemption and was re-prefilled.
            kept = table.windows.rows(resumed_slots)
            lead = leading_filled(kept.filled)
            parts.append(drop_leading(kept, lead, mask_id))
            starts.append(table.committed_len[resumed_slots] + lead)
            sizes.append(kept.length - lead)  # the same slots as before the preemption
        committed_len = torch.cat(starts)
        plan = plan_windows(WindowBatch.cat(parts), torch.cat(sizes), committed_len, self.max_model_len)
        table.keep(torch.cat([new_slots, resumed_slots]), plan.windows, plan.order, committed_len)
        returned = leading_runs(plan, sampled.shape[1])  # [P, width]
        if new_lossless.any():  # a lossless window's slot 0 goes back once verified (its KV written)
            silent = torch.from_numpy(np.concatenate([new_lossless, np.zeros(num_resumed, bool)]))
            returned = torch.where(silent.to(self.device, non_blocking=True)[:, None], -1, returned)
        sampled[rows] = returned

    def _start_windows(self, req_ids: list[str], states: list[RequestState], first: np.ndarray,
                       committed_len: np.ndarray) -> None:
        """Plan the first window of the ``first`` ([B] bool) requests, which start after
        ``committed_len`` ([B]) tokens: empty windows of the server's W (the scheduler adds first
        windows only where W is fixed), planned on the host as ``_sample`` plans them after a
        prefill (``core.batch.plan_windows``), then kept in the table."""
        rows = np.flatnonzero(first)
        if any(states[row].params.lossless for row in rows):
            raise RuntimeError(f"lossless WeDLM request {req_ids[rows[0]]} got a window before its first token")
        window_size = self.wedlm.window_size
        starts = committed_len[rows]
        plan = plan_windows(WindowBatch.empty(len(rows), self.wedlm_table.capacity, self.wedlm_mask_id),
                            window_size, torch.from_numpy(starts), self.max_model_len)
        self.wedlm_table.start(np.array([states[row].slot for row in rows], np.int64), plan, starts)
        if self.wedlm_window_trace is not None:
            for row in rows:
                self.wedlm_window_trace.setdefault(req_ids[row], []).append(window_size)

    def _calc_spec_decode_metadata(self, num_draft_tokens: np.ndarray, cu_num_scheduled_tokens: np.ndarray):
        # vLLM's speculative-decoding rows (each request's drafts plus a bonus row), device tensors
        # built by its ``_prepare_inputs`` for a step with drafts; ours replaces them with the WeDLM
        # step's own logits rows, so they are not built.
        return _NO_SPEC_DECODE_ROWS

    def _sampling_batch(self, counts: np.ndarray, num_ar_rows: np.ndarray) -> SamplingBatch:
        """Per-row sampling settings of ``counts[i]`` ([B]) logits rows of each request of the step, the
        first ``num_ar_rows[i]`` of them next-token rows, from vLLM's input batch."""
        meta = self.input_batch.sampling_metadata
        # Mask rows never draw the mask token; a next-token row may (as in --decoding ar).
        ar_rows = _ragged_arange(counts) < np.repeat(num_ar_rows, counts)  # [N]
        ban = torch.from_numpy(~ar_rows).to(self.device, non_blocking=True) if ar_rows.any() else None
        if meta.all_greedy:
            return SamplingBatch(None, None, None, ban)
        rows = torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).to(self.device, non_blocking=True)
        starts = np.cumsum(counts) - counts
        return SamplingBatch(
            temperature=meta.temperature[rows],
            top_k=None if meta.top_k is None else meta.top_k[rows].long(),
            top_p=None if meta.top_p is None else meta.top_p[rows].float(),
            ban_mask_token=ban,
            generators=[(int(starts[row]), int(counts[row]), gen) for row, gen in meta.generators.items()
                        if row < len(counts) and counts[row]],
        )

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata) -> SamplerOutput:
        if self.wedlm.fixed_window_rows:
            return self._sample_fixed_rows(logits)
        step, table = self._wedlm_step, self.wedlm_table
        host = table.host
        num_reqs = len(step.req_ids)
        states = [self.wedlm_requests[req_id] for req_id in step.req_ids]
        has_window = np.fromiter((s.has_window for s in states), bool, num_reqs)

        # The windows forwarded now: this forward wrote the KV of each one's leading run (a
        # lossless window's first run of accepted fills, known below), which the next plan drops.
        w_slots = step.slots[step.window]
        w_checks = step.num_checks[step.window]  # [Bw], > 0 for lossless windows
        lead = host.num_commit[w_slots]  # [Bw]
        lossless_runs = host.input_ids[w_slots[step.lossless[step.window]]]  # [Bl, C]: before the table moves on
        start_len = host.committed_len[w_slots]  # [Bw]
        self.wedlm_request_forwards += len(w_slots)

        autoregressive = step.autoregressive
        new = step.completes_prefill & ~autoregressive & ~has_window  # first window after the prompt
        resumed = step.completes_prefill & ~autoregressive & has_window  # re-prefilled after preemption
        # A plain window's leading run went back to vLLM as output before its forward, so the
        # re-prefill covered it: such a window resumes one run later, with the same other slots.
        moved = resumed & ~step.lossless
        expected_len = host.committed_len[step.slots] + np.where(moved, host.num_commit[step.slots], 0)
        for row in np.flatnonzero(resumed & (expected_len != step.committed_len)):
            raise RuntimeError(f"WeDLM request {step.req_ids[row]}: re-prefilled {step.committed_len[row]} "
                               f"tokens, but its window starts after {expected_len[row]}")
        plan_slots = np.concatenate([w_slots, step.slots[new], step.slots[moved]])  # [P]
        num_planned = len(w_slots) + int(new.sum())  # windows planned afresh (not moved)
        window_size = self.wedlm.step_window_size(num_planned)  # W of every window planned now
        if self.wedlm_window_trace is not None:
            for row in np.flatnonzero(step.window | new):
                self.wedlm_window_trace.setdefault(step.req_ids[row], []).append(window_size)
        num_rows = int(step.num_logits.sum())
        verified_commit = w_checks.any()
        # Every row is a plain window's mask row: the step's fixed device work (compiled on a GPU).
        plain = bool(len(plan_slots) and num_rows and step.window.all() and not verified_commit)
        row_kind = None if plain else self._row_kinds(step)

        device_out = []
        tokens = None  # [N]; in a plain step of greedy rows the window step draws them itself
        if num_rows:
            sampling = self._sampling_batch(step.num_logits, step.num_ar_rows)
            if not (plain and sampling.temperature is None and sampling.ban_mask_token is None):
                tokens = sample(logits, sampling, self.wedlm_mask_id)
        if len(plan_slots):
            # Tokens before each next window: a window's start moves by its committed run, which the
            # host knows (its leading run) unless the window is lossless (verified on the device).
            starts = np.concatenate([start_len if verified_commit else start_len + lead, step.committed_len[new],
                                     step.committed_len[moved]])  # [P]
            slots_dev, committed_len = plan_rows(plan_slots, starts, self.device)  # [P] each, one copy
        if plain:
            self.wedlm_window_step_runs["steps"] += 1
            *following, packet = self.wedlm_window_step(
                table.windows, slots_dev, logits, tokens, table.entropy_threshold, table.pos_penalty, committed_len,
                window_size, self.max_model_len, self.wedlm_mask_id)
            table.windows.store(slots_dev, WindowBatch(*following))
            device_out.append(packet.flatten())
        elif len(plan_slots):
            parts = []
            sizes: torch.Tensor | int = window_size
            if len(w_slots):
                ws = slots_dev[: len(w_slots)]
                planned = table.windows.rows(ws)
                verified, commit = None, leading_filled(planned.filled)
                if verified_commit:
                    verified, commit = self._verify(planned, tokens, row_kind, w_slots, w_checks, window_size)
                    device_out.append(commit)
                mask_rows = row_kind == _MASK_ROW
                mask_logits = self._rows(logits, mask_rows)
                parts.append(finish_windows(planned, commit, row_entropy(mask_logits), self._rows(tokens, mask_rows),
                                            table.entropy_threshold[ws], table.pos_penalty[ws], self.wedlm_mask_id,
                                            verified))
            if new.any():
                fresh = WindowBatch.empty(int(new.sum()), table.capacity, self.wedlm_mask_id, self.device)
                lossless_new = step.lossless[new]
                if lossless_new.any():
                    # A lossless window starts with the token drawn from the prompt's last row.
                    first = self._rows(tokens, row_kind == _FIRST_TOKEN_ROW)
                    index = torch.from_numpy(np.flatnonzero(lossless_new)).to(self.device, non_blocking=True)
                    fresh.tokens[index, 0] = first
                    fresh.filled[index, 0] = True
                parts.append(fresh)
            if moved.any():
                ms = slots_dev[num_planned:]
                run = torch.from_numpy(host.num_commit[step.slots[moved]]).to(self.device, non_blocking=True)
                parts.append(drop_leading(table.windows.rows(ms), run, self.wedlm_mask_id))
                # Planned to its own length: the same slots as before the preemption.
                kept = host.length[step.slots[moved]] - host.num_commit[step.slots[moved]]
                sizes = torch.from_numpy(np.concatenate([np.full(num_planned, window_size), kept])).to(self.device)
            if verified_commit:
                committed_len = torch.cat([committed_len[: len(w_slots)] + commit, committed_len[len(w_slots):]])
            plan = plan_windows(WindowBatch.cat(parts), sizes, committed_len, self.max_model_len)
            device_out.append(table.store(slots_dev, plan).flatten())
        if step.ar_next.any():
            device_out.append(self._rows(tokens, row_kind == _AR_NEXT_ROW))
        # The step's one device-to-host copy.
        received = torch.cat(device_out).cpu().numpy() if device_out else np.zeros(0, np.int64)
        commit = lead
        if verified_commit:
            commit, received = received[: len(w_slots)], received[len(w_slots):]
        packet_size = len(plan_slots) * packet_width(table.capacity)
        if len(plan_slots):
            table.receive(plan_slots, received[:packet_size].reshape(len(plan_slots), -1),
                          np.concatenate([start_len + commit, step.committed_len[new], step.committed_len[moved]]))
        ar_tokens = received[packet_size:]

        # The step's sampled tokens: a plain window's next leading run (decided now, forwarded
        # next step), a lossless window's verified run (forwarded now), an AR request's draw.
        planned_rows = step.window | new | resumed
        early = planned_rows & ~step.lossless
        run_len = np.zeros(num_reqs, np.int64)  # [B]
        run_len[early] = host.num_commit[step.slots[early]]
        verified_rows = step.window & step.lossless
        lossless_commit = commit[step.lossless[step.window]]  # [Bl]
        width = max(2, int(run_len.max(initial=0)), int(lossless_commit.max(initial=0)))  # width 1 keeps -1 padding
        columns = np.arange(width)
        sampled = np.full((num_reqs, width), -1, dtype=np.int32)
        sampled[early] = np.where(columns < run_len[early, None], host.input_ids[step.slots[early], :width], -1)
        sampled[verified_rows] = np.where(columns < lossless_commit[:, None], lossless_runs[:, :width], -1)
        sampled[step.ar_next, 0] = ar_tokens
        for row in np.flatnonzero(step.window | new):
            states[row].has_window = True
        next_windows: dict[str, list[int]] = {}
        for row in np.flatnonzero(planned_rows):
            slot = step.slots[row]
            next_windows[step.req_ids[row]] = host.input_ids[slot, run_len[row]: host.length[slot]].tolist()
        self._wedlm_next_windows = next_windows
        self._wedlm_unforwarded = {step.req_ids[row]: int(run_len[row])
                                   for row in np.flatnonzero(step.window & (run_len > 0))}
        # On the host: vLLM's bookkeeping reads it there (no device round trip).
        return SamplerOutput(sampled_token_ids=torch.from_numpy(sampled), logprobs_tensors=None)

    def _row_kinds(self, step: StepRows) -> np.ndarray:
        """[N] int8: what each logits row of the step is for (``_MASK_ROW`` ...), request by request."""
        k = _ragged_arange(step.num_logits)  # [N]
        checking = k < np.repeat(step.num_checks, step.num_logits)
        kind = np.where(checking, _CHECK_ROW, _MASK_ROW).astype(np.int8)
        kind[np.repeat(step.ar_next, step.num_logits)] = _AR_NEXT_ROW
        kind[np.repeat(step.first_token, step.num_logits)] = _FIRST_TOKEN_ROW
        return kind

    def _rows(self, values: torch.Tensor, chosen: np.ndarray) -> torch.Tensor:
        """The ``chosen`` ([N] bool, host) rows of ``values`` ([N, ...], device); no copy when all are."""
        if chosen.all():
            return values
        return values[torch.from_numpy(np.flatnonzero(chosen)).to(self.device, non_blocking=True)]

    def _verify(self, planned: WindowBatch, tokens: torch.Tensor, row_kind: np.ndarray, w_slots: np.ndarray,
                w_checks: np.ndarray, window_size: int) -> tuple[WindowBatch, torch.Tensor]:
        """Check the lossless windows' fills against their AR rows' draws (``core.sampling.verify``,
        ``core.batch.verify_windows``); the windows to fill on and the committed run of every window
        of the step ([Bw], device). ``window_size``: the W of the windows' next plan."""
        check_tokens = self._rows(tokens, row_kind == _CHECK_ROW)  # [R]: the AR rows' own draws
        drafts = verification_drafts(torch.from_numpy(self.wedlm_table.host.input_ids[w_slots]),
                                     torch.from_numpy(w_checks))  # [R], on the host: no device sync
        accepted = accept_drafts(check_tokens, drafts.to(self.device, non_blocking=True))
        return verify_windows(planned, torch.from_numpy(w_checks).to(self.device, non_blocking=True), accepted,
                              check_tokens, window_size, self.wedlm_mask_id)

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
                        # tokens were wrong (BENCHMARKS.md 5.13). Without it, FlashAttention computes
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
        output = super().sample_tokens(grammar_output)
        if isinstance(output, ModelRunnerOutput) and not self.wedlm.fixed_window_rows:
            values = {f.name: getattr(output, f.name) for f in fields(output)}
            output = WeDLMRunnerOutput(**values, next_windows=self._wedlm_next_windows,
                                       unforwarded=self._wedlm_unforwarded)
        return output


class WeDLMWorkerMixin:
    """What the WeDLM CPU and GPU workers add to vLLM's, callable through ``LLM.collective_rpc``."""

    def wedlm_request_forwards(self) -> int:
        """Windows forwarded so far: ``llm.collective_rpc("wedlm_request_forwards")``."""
        return self.model_runner.wedlm_request_forwards

    def wedlm_graph_modes(self) -> dict[str, int]:
        """Steps run per CUDA graph mode so far: ``llm.collective_rpc("wedlm_graph_modes")``."""
        return dict(self.model_runner.wedlm_graph_modes)

    def wedlm_window_steps(self) -> dict[str, int]:
        """Steps of plain windows so far whose device work ran compiled and eagerly (the GPU worker
        compiles it; a variant start-up missed runs eagerly): ``llm.collective_rpc("wedlm_window_steps")``."""
        runs = self.model_runner.wedlm_window_step_runs
        return {"compiled": runs["compiled"], "eager": runs["steps"] - runs["compiled"]}

    def wedlm_row_layouts(self) -> dict[str, int]:
        """Fixed window rows: steps so far whose windows all forwarded 2W rows ("padded") and the
        others ("exact"), and windows void for a step ("void_windows"):
        ``llm.collective_rpc("wedlm_row_layouts")``."""
        runner = self.model_runner
        return {**runner.wedlm_row_layouts, "void_windows": int(runner.wedlm_void_windows)}  # one sync, here

    def wedlm_trace_window_sizes(self, on: bool) -> dict[str, list[int]]:
        """Start (``on``) or stop recording the window size W of every window planned, per request
        (vLLM's internal request id), and return what was recorded since the last call:
        ``llm.collective_rpc("wedlm_trace_window_sizes", args=(True,))``. For checks of the
        adaptive window (``--wedlm-window-tokens``) against the reference decoder run at the same W."""
        runner = self.model_runner
        trace, runner.wedlm_window_trace = runner.wedlm_window_trace or {}, ({} if on else None)
        return trace
