"""The WeDLM overrides of vLLM's V1 model runner, shared by the CPU and GPU workers.

Per step and request, the scheduler hands over either a prefill chunk or a window (its "draft"
tokens, in the physical order this runner planned). The overrides, in the order vLLM calls them:

* ``_update_states``: forget the window of finished and new requests. A preempted request keeps
  its window (filled, uncommitted slots included): vLLM re-prefills its committed tokens, some
  steps later and perhaps in chunks, and the window resumes exactly where it stopped;
* ``_prepare_inputs``: after vLLM computed slots from physical positions, rewrite the RoPE
  positions of window tokens to their logical ones, and ask for the logits of mask rows only;
* ``_sample``: run ``core`` (entropy, selection, sampling, commit, refill) instead of vLLM's
  sampler; the committed tokens are the step's sampled tokens, a prefill samples none and, once
  complete, schedules the request's first window (or the one it had when it was preempted);
* ``sample_tokens``: attach each request's next window to the output for the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.outputs import WeDLMRunnerOutput
from vllm_wedlm.config import WeDLMSettings, request_decoding
from vllm_wedlm.core import StepPlan, WeDLMParams, finish_step, plan_step
from vllm_wedlm.core.sampling import SamplingSpec, sample_rows
from vllm_wedlm.core.selection import row_entropy

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


@dataclass
class RequestWindow:
    """The runner's state of one request in WeDLM mode, kept from its first window to its end.

    vLLM's scheduler knows a window only as the request's draft tokens, and drops them when it
    preempts the request (and sets ``num_computed_tokens`` to 0); the committed tokens stay in
    the request and are re-prefilled. So the window (tokens, which slots are filled, its physical
    order) lives here, and survives preemption: the next forward after the re-prefill is the one
    the request would have run without it, so its output does not depend on preemption.
    """

    params: WeDLMParams
    plan: StepPlan | None = None  # the window scheduled next (its input ids went out as drafts)
    committed_len: int = 0  # tokens before the planned window: its slot i sits at committed_len + i
    # A request that asked for ``wedlm_decoding: "ar"``: no window; its one "draft" is the token
    # sampled last step, forwarded (and so committed) by the next step, whose row, as in AR
    # decoding, predicts the token after it. ``next_token`` survives preemption like a window.
    autoregressive: bool = False
    next_token: int | None = None


@dataclass
class RowStep:
    """What one request does in the current step."""

    req_id: str
    row: int  # index in the input batch
    num_logits: int  # mask rows whose logits are computed (the request's last rows)
    committed_len: int  # tokens whose KV is exact before this step (after it, for a prefill)
    is_window: bool  # else a prefill chunk
    completes_prefill: bool = False


class WeDLMRunnerMixin:
    """The WeDLM overrides, on top of vLLM's V1 runner (``GPUModelRunner`` or its CPU subclass)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wedlm = WeDLMSettings.from_additional_config(self.vllm_config.additional_config)
        self.wedlm_mask_id = int(self.model_config.hf_config.mask_token_id)
        self.wedlm_requests: dict[str, RequestWindow] = {}
        self._wedlm_rows: list[RowStep] = []
        self._wedlm_next_windows: dict[str, list[int]] = {}
        # Windows forwarded since start-up (one per request per step), for tokens-per-forward
        # measurements over a chosen set of requests (``LLM.collective_rpc``, see the workers).
        self.wedlm_request_forwards = 0
        # vLLM's spec-decode bookkeeping (``_calc_spec_decode_metadata``, run by ``_prepare_inputs``
        # although WeDLM uses none of it) counts each request's drafts plus one bonus row. Speculative
        # decoding schedules that bonus row as a token; a WeDLM window is drafts only, so a full
        # batch of full windows (max_num_seqs x 2W = the token budget) counts up to
        # max_num_tokens + num_reqs rows, past the end of its [max_num_tokens] scratch aranges.
        rows = self.max_num_tokens + self.max_num_reqs + 1
        if len(self.arange_np) < rows:
            self.arange_np = np.arange(rows, dtype=np.int64)  # [rows] 0, 1, 2, ... (read-only source)
            self._arange_scratch = np.empty(rows, dtype=np.int64)  # [rows]

    def _update_states(self, scheduler_output: SchedulerOutput) -> Callable | None:
        # Preempted and resumed requests keep their windows (see RequestWindow). A new request
        # may reuse the id of a finished one (vLLM treats them as two requests).
        stale = set(scheduler_output.finished_req_ids) | {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for req_id in stale:
            self.wedlm_requests.pop(req_id, None)
        return super()._update_states(scheduler_output)

    def _request_window(self, req_id: str) -> RequestWindow:
        state = self.wedlm_requests.get(req_id)
        if state is None:
            extra_args = self.requests[req_id].sampling_params.extra_args
            state = RequestWindow(params=self.wedlm.request_params(extra_args),
                                  autoregressive=request_decoding(extra_args) == "ar")
            self.wedlm_requests[req_id] = state
        return state

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens: np.ndarray):
        super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        num_reqs = self.input_batch.num_reqs
        starts = self.query_start_loc.np[: num_reqs + 1]
        total = int(starts[num_reqs])
        positions = np.empty(total, dtype=np.int64)  # [num_tokens] RoPE positions
        logits_rows: list[np.ndarray] = []
        self._wedlm_rows = []
        windows = scheduler_output.scheduled_spec_decode_tokens
        for row, req_id in enumerate(self.input_batch.req_ids[:num_reqs]):
            start, n = int(starts[row]), int(num_scheduled_tokens[row])
            computed = int(self.input_batch.num_computed_tokens_cpu[row])
            state = self._request_window(req_id)
            if req_id in windows and state.autoregressive:
                if n != 1 or state.next_token is None:
                    raise RuntimeError(f"AR request {req_id} on a WeDLM engine: {n} tokens scheduled for 1")
                positions[start] = computed
                step = RowStep(req_id, row, 1, computed, is_window=True)
            elif req_id in windows:
                plan = state.plan
                if plan is None or n != len(plan.window):
                    raise RuntimeError(
                        f"WeDLM request {req_id}: {n} tokens scheduled for a window of "
                        f"{0 if plan is None else len(plan.window)}; the token budget must fit "
                        "every running window (max_num_batched_tokens >= max_num_seqs * 2 * window_size)"
                    )
                positions[start:start + n] = computed + plan.order.numpy()
                step = RowStep(req_id, row, plan.num_masks, computed, is_window=True)
            else:
                positions[start:start + n] = np.arange(computed, computed + n)
                done = computed + n >= self.requests[req_id].num_tokens
                # An AR request samples its first token from the prompt's last row, as vLLM's
                # sampler would (after a preemption it already holds it).
                first_token = done and state.autoregressive and state.next_token is None
                step = RowStep(req_id, row, int(first_token), computed + n, is_window=False, completes_prefill=done)
            logits_rows.append(np.arange(start + n - step.num_logits, start + n))
            self._wedlm_rows.append(step)
        # Slots were computed from physical positions (num_computed + i) by the call above;
        # only RoPE sees the logical ones. In place: CUDA graphs read this buffer.
        self.positions[:total].copy_(torch.from_numpy(positions), non_blocking=True)
        indices = torch.from_numpy(np.concatenate(logits_rows) if logits_rows else np.zeros(0, np.int64))
        return indices.to(self.device, non_blocking=True), None

    def _sampling_spec(self, row: int, autoregressive: bool) -> SamplingSpec:
        batch = self.input_batch
        top_k = int(batch.top_k_cpu[row])
        return SamplingSpec(
            temperature=float(batch.temperature_cpu[row]),
            top_k=0 if top_k >= batch.vocab_size else top_k,
            top_p=float(batch.top_p_cpu[row]),
            generator=batch.generators.get(row),
            ban_mask_token=not autoregressive,
        )

    def _sample(self, logits, spec_decode_metadata) -> SamplerOutput:
        rows = self._wedlm_rows
        counts = [step.num_logits for step in rows]
        if logits is not None and logits.shape[0]:
            entropy = row_entropy(logits).cpu()
            specs = [self._sampling_spec(s.row, self._request_window(s.req_id).autoregressive) for s in rows]
            tokens = sample_rows(logits, specs, counts, self.wedlm_mask_id).cpu()
        else:
            entropy, tokens = torch.zeros(0), torch.zeros(0, dtype=torch.long)
        committed: list[list[int]] = []
        self._wedlm_next_windows = {}
        offset = 0
        for step, count in zip(rows, counts, strict=True):
            state = self._request_window(step.req_id)
            seg = slice(offset, offset + count)
            offset += count
            if state.autoregressive:
                # Commits last step's token (forwarded now), holds the one its row predicts.
                committed.append([state.next_token] if step.is_window else [])
                if count:
                    state.next_token = int(tokens[seg][0])
                if step.is_window or step.completes_prefill:
                    self._wedlm_next_windows[step.req_id] = [state.next_token]
                continue
            if step.is_window:
                self.wedlm_request_forwards += 1
                plan = state.plan
                committed.append(plan.committed.tolist())
                window = finish_step(plan, entropy[seg], tokens[seg], state.params)
                committed_len = step.committed_len + plan.num_commit
            else:
                committed.append([])
                if not step.completes_prefill:
                    continue
                if state.plan is not None:
                    # A re-prefill after preemption: its committed tokens are back in the KV
                    # cache, and the window it had is scheduled again, unchanged.
                    if state.committed_len != step.committed_len:
                        raise RuntimeError(f"WeDLM request {step.req_id}: re-prefilled {step.committed_len} tokens, "
                                           f"but its window starts after {state.committed_len}")
                    self._wedlm_next_windows[step.req_id] = state.plan.input_ids.tolist()
                    continue
                window, committed_len = None, step.committed_len
            # No slot reaches max_model_len (the request's KV room); max_tokens plays no part here
            # (it only truncates the committed tokens, in vLLM's stop check), as in WeDLM's engine.
            state.plan = plan_step(window, self.wedlm.window_size, committed_len, self.max_model_len,
                                   self.wedlm_mask_id)
            state.committed_len = committed_len
            self._wedlm_next_windows[step.req_id] = state.plan.input_ids.tolist()
        width = max(2, max((len(c) for c in committed), default=0))  # width 1 would keep -1 padding
        sampled = torch.full((len(committed), width), -1, dtype=torch.int32)
        for i, ids in enumerate(committed):
            sampled[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        return SamplerOutput(sampled_token_ids=sampled.to(self.device), logprobs_tensors=None)

    def _bookkeeping_sync(self, *args, **kwargs):
        # vLLM rewinds the generator of a discarded (partial-prefill) row by one draw; WeDLM drew
        # nothing for it, and CPU generators have no offset to rewind.
        generators, self.input_batch.generators = self.input_batch.generators, {}
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            self.input_batch.generators = generators

    def sample_tokens(self, grammar_output):
        output = super().sample_tokens(grammar_output)
        if isinstance(output, ModelRunnerOutput):
            values = {f.name: getattr(output, f.name) for f in fields(output)}
            output = WeDLMRunnerOutput(**values, next_windows=self._wedlm_next_windows)
        return output


class WeDLMWorkerMixin:
    """What the WeDLM CPU and GPU workers add to vLLM's, callable through ``LLM.collective_rpc``."""

    def wedlm_request_forwards(self) -> int:
        """Windows forwarded so far: ``llm.collective_rpc("wedlm_request_forwards")``."""
        return self.model_runner.wedlm_request_forwards
