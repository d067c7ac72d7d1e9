"""The WeDLM overrides of vLLM's V1 model runner, shared by the CPU and GPU workers.

Per step and request, the scheduler hands over either a prefill chunk or a window (its "draft"
tokens, in the physical order this runner planned). The overrides, in the order vLLM calls them:

* ``_update_states``: forget the window of finished, preempted (the window restarts after the
  re-prefill), resumed and new requests;
* ``_prepare_inputs``: after vLLM computed slots from physical positions, rewrite the RoPE
  positions of window tokens to their logical ones, and ask for the logits of mask rows only;
* ``_sample``: run ``core`` (entropy, selection, sampling, commit, refill) instead of vLLM's
  sampler; the committed tokens are the step's sampled tokens, a prefill samples none;
* ``sample_tokens``: attach each request's next window to the output for the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from vllm.v1.outputs import ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.outputs import WeDLMRunnerOutput
from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core import StepPlan, WeDLMParams, finish_step, plan_step
from vllm_wedlm.core.sampling import SamplingSpec, sample_rows
from vllm_wedlm.core.selection import row_entropy


@dataclass
class RequestWindow:
    """The runner's state of one request in WeDLM mode."""

    params: WeDLMParams
    limit: int  # no slot at or past this position: min(prompt + max_tokens, max_model_len)
    plan: StepPlan | None = None  # the window scheduled next (its input ids went out as drafts)


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

    def _update_states(self, scheduler_output):
        cached = scheduler_output.scheduled_cached_reqs
        stale = set(scheduler_output.finished_req_ids) | set(scheduler_output.preempted_req_ids or ())
        stale |= set(cached.resumed_req_ids) | {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for req_id in stale:
            self.wedlm_requests.pop(req_id, None)
        return super()._update_states(scheduler_output)

    def _request_window(self, req_id: str) -> RequestWindow:
        state = self.wedlm_requests.get(req_id)
        if state is None:
            request = self.requests[req_id]
            params = request.sampling_params
            limit = min(request.num_prompt_tokens + params.max_tokens, self.max_model_len)
            state = RequestWindow(params=self.wedlm.request_params(params.extra_args), limit=limit)
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
            if req_id in windows:
                plan = self.wedlm_requests[req_id].plan
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
                step = RowStep(req_id, row, 0, computed + n, is_window=False, completes_prefill=done)
            logits_rows.append(np.arange(start + n - step.num_logits, start + n))
            self._wedlm_rows.append(step)
        # Slots were computed from physical positions (num_computed + i) by the call above;
        # only RoPE sees the logical ones. In place: CUDA graphs read this buffer.
        self.positions[:total].copy_(torch.from_numpy(positions), non_blocking=True)
        indices = torch.from_numpy(np.concatenate(logits_rows) if logits_rows else np.zeros(0, np.int64))
        return indices.to(self.device, non_blocking=True), None

    def _sampling_spec(self, row: int) -> SamplingSpec:
        batch = self.input_batch
        top_k = int(batch.top_k_cpu[row])
        return SamplingSpec(
            temperature=float(batch.temperature_cpu[row]),
            top_k=0 if top_k >= batch.vocab_size else top_k,
            top_p=float(batch.top_p_cpu[row]),
            generator=batch.generators.get(row),
        )

    def _sample(self, logits, spec_decode_metadata) -> SamplerOutput:
        rows = self._wedlm_rows
        counts = [step.num_logits for step in rows]
        if logits is not None and logits.shape[0]:
            entropy = row_entropy(logits).cpu()
            tokens = sample_rows(logits, [self._sampling_spec(s.row) for s in rows], counts, self.wedlm_mask_id).cpu()
        else:
            entropy, tokens = torch.zeros(0), torch.zeros(0, dtype=torch.long)
        committed: list[list[int]] = []
        self._wedlm_next_windows = {}
        offset = 0
        for step, count in zip(rows, counts):
            state = self._request_window(step.req_id)
            seg = slice(offset, offset + count)
            offset += count
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
                window, committed_len = None, step.committed_len
            state.plan = plan_step(window, self.wedlm.window_size, committed_len, state.limit, self.wedlm_mask_id)
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
