"""A step harness for the V2 binding (vllm_wedlm/v2), built from vLLM 0.34's own objects, on the CPU.

vLLM's V2 runner cannot start here (no CPU build of 0.34, and its attention runs C++ or CUDA ops),
so this steps the parts of it that WeDLM touches, in the runner's order
(vllm/v1/worker/gpu/model_runner.py, ``execute_model`` and ``sample_tokens``):

    schedule -> remove / add requests -> positions, prefill ids and canvas rows (vLLM's Triton
    kernels, run by Triton's interpreter) -> WeDLMModelState.prepare_inputs -> forward ->
    compute_sample_logits -> sampler -> post_update -> postprocess_state -> update_from_output

Real: ``WeDLMScheduler`` (vLLM's scheduler, KV block manager and stop checks), ``RequestState``,
``InputBuffers``/``InputBatch``, vLLM's ``Sampler`` (wrapped by ``WeDLMSampler``), and the kernels
``prepare_prefill_inputs``, ``prepare_pos_seq_lens``, ``combine_sampled_and_draft_tokens``,
``expand_idx_mapping``, ``get_num_sampled_and_rejected`` and ``post_update``. Standing in for the
runner's model and attention: transformers' Qwen3 (the reference decoder's), which recomputes each
request's attention from its token history (vLLM's ``all_token_ids`` up to ``num_computed_tokens``,
exactly the tokens whose KV a paged cache would hold) plus the step's rows, at the positions
``prepare_inputs`` returned. The host copy of the sampled tokens is ``AsyncOutput.get_output``'s
(which needs CUDA streams).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from vllm.config import CacheConfig, DiffusionConfig, ModelConfig, ReasoningConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.gpu.input_batch import (
    InputBatch,
    InputBuffers,
    combine_sampled_and_draft_tokens,
    expand_idx_mapping,
    post_update,
    prepare_pos_seq_lens,
    prepare_prefill_inputs,
)
from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids
from vllm.v1.worker.gpu.sample.sampler import Sampler
from vllm.v1.worker.gpu.states import RequestState

from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.v2.model_state import WeDLMModelState
from vllm_wedlm.v2.registration import register
from vllm_wedlm.v2.scheduler import WeDLMScheduler
from vllm_wedlm.v2.window_table import canvas_width

DEVICE = torch.device("cpu")


class HistoryQwen(nn.Module):
    """The model the state sees: a transformers Qwen causal LM that attends to a request's token
    history (its committed KV) and then the step's rows, with plain causal attention."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(hidden_states)

    @torch.no_grad()
    def hidden(self, history: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[q, H] hidden states of the rows ``input_ids`` at ``positions`` after ``history``."""
        ids = torch.cat([history.long(), input_ids.long()])
        pos = torch.cat([torch.arange(len(history)), positions.long()])
        out = self.lm.model(input_ids=ids[None], position_ids=pos[None])
        return out.last_hidden_state[0, len(history):]


@dataclass
class Finished:
    token_ids: list[int]
    finish_reason: str


@dataclass
class Trace:
    """What the harness saw, for the test's invariants."""

    steps: int = 0
    preemptions: int = 0
    preempted: set[str] = field(default_factory=set)  # the requests preempted at least once
    # Request id -> tokens each of its window forwards committed, in order (the first commits none).
    runs: dict[str, list[int]] = field(default_factory=dict)


def vllm_config(checkpoint: Path, window_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                max_model_len: int, block_size: int, reasoning: ReasoningConfig | None = None,
                tokenizer: bool = False) -> VllmConfig:
    """A synchronous V2 engine's config for a WeDLM checkpoint: a canvas of 2 W, the WeDLM scheduler;
    ``reasoning``: its markers' token ids set (the harness has no tokenizer to find them);
    ``tokenizer``: load the checkpoint's tokenizer (structured outputs compile grammars with it)."""
    register()
    model = ModelConfig(model=str(checkpoint), dtype="float32", seed=0, max_model_len=max_model_len,
                        skip_tokenizer_init=not tokenizer)
    scheduler = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, enable_chunked_prefill=True, async_scheduling=False,
                                scheduler_cls=WeDLMScheduler, is_encoder_decoder=False)
    return VllmConfig(model_config=model, scheduler_config=scheduler,
                      cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=False),
                      diffusion_config=DiffusionConfig(canvas_length=canvas_width(window_size)),
                      reasoning_config=reasoning)


class StepHarness:
    def __init__(self, checkpoint: Path, window_size: int = 16, max_num_seqs: int = 4,
                 max_num_batched_tokens: int = 512, max_model_len: int = 512, block_size: int = 16,
                 num_blocks: int = 256, reasoning: ReasoningConfig | None = None, tokenizer: bool = False):
        self.config = vllm_config(checkpoint, window_size, max_num_seqs, max_num_batched_tokens, max_model_len,
                                  block_size, reasoning, tokenizer)
        self.canvas = canvas_width(window_size)
        kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                                          dtype=torch.float32))])
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = WeDLMScheduler(vllm_config=self.config, kv_cache_config=kv_cache,
                                        structured_output_manager=StructuredOutputManager(self.config),
                                        block_size=block_size, log_stats=True)
        vocab = self.config.model_config.get_vocab_size()
        self.req_states = RequestState(max_num_seqs, max_model_len, max_num_batched_tokens, self.canvas, vocab, DEVICE)
        self.buffers = InputBuffers(max_num_seqs, max_num_batched_tokens, DEVICE)
        self.model = HistoryQwen(load_transformers_model(checkpoint))
        self.state = WeDLMModelState(self.config, self.model, None, DEVICE)
        base = Sampler(vllm_config=self.config, max_num_reqs=max_num_seqs, vocab_size=vocab, device=DEVICE,
                       req_states=self.req_states, num_speculative_tokens=self.canvas)
        self.sampler, rejection_sampler = self.state.custom_sampler(base)
        assert rejection_sampler is None
        self.outputs: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[tuple[list[int], list[float]]]] = {}
        self.finished: dict[str, Finished] = {}
        self.trace = Trace()

    def add(self, req_id: str, prompt: list[int], params: SamplingParams) -> None:
        request = Request(req_id, prompt, params, None)
        if request.use_structured_output:  # the engine core compiles its grammar as it adds it
            self.scheduler.structured_output_manager.grammar_init(request)
        self.scheduler.add_request(request)
        self.outputs[req_id] = []

    def run(self, max_steps: int = 10_000) -> dict[str, Finished]:
        while self.scheduler.has_unfinished_requests():
            assert self.trace.steps < max_steps, "no progress"
            self.step()
        return self.finished

    def step(self) -> None:
        scheduler_output = self.scheduler.schedule()
        self.trace.steps += 1
        self.trace.preemptions += len(scheduler_output.preempted_req_ids or ())
        self.trace.preempted |= set(scheduler_output.preempted_req_ids or ())
        self._update_requests(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            runner_output = ModelRunnerOutput(req_ids=[])
        else:
            runner_output = self._execute(scheduler_output)
        for outputs in self.scheduler.update_from_output(scheduler_output, runner_output).values():
            for output in outputs.outputs:
                self.outputs[output.request_id] += output.new_token_ids
                if output.new_logprobs is not None:  # each token's entry: (ids, log-probs), the token first
                    self.logprobs.setdefault(output.request_id, []).extend(
                        zip(output.new_logprobs.logprob_token_ids.tolist(), output.new_logprobs.logprobs.tolist(),
                            strict=True))
                if output.finish_reason is not None:
                    self.finished[output.request_id] = Finished(self.outputs[output.request_id],
                                                                str(output.finish_reason))

    def _update_requests(self, so: SchedulerOutput) -> None:
        """The runner's finish_requests, add_requests and update_requests."""
        for req_id in sorted(so.finished_req_ids | (so.preempted_req_ids or set())):
            self.state.remove_request(req_id)  # before req_states: the state may still read the slot
            self.req_states.remove_request(req_id)
        for new in so.scheduled_new_reqs:
            self.req_states.add_request(new.req_id, new.prompt_len, new.prefill_token_ids,
                                        new.num_computed_tokens, new.sampling_params.max_tokens)
            index = self.req_states.req_id_to_index[new.req_id]
            self.state.add_request(index, new)
            self.sampler.add_request(index, new.sampling_params)
        if so.scheduled_new_reqs:
            self.req_states.apply_staged_writes()
            self.state.apply_staged_writes()
            self.sampler.apply_staged_writes()
        cached = so.scheduled_cached_reqs
        for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            self.req_states.num_computed_tokens_np[self.req_states.req_id_to_index[req_id]] = num_computed
        np.minimum(self.req_states.num_computed_tokens_np, self.req_states.prefill_len.np,
                   out=self.req_states.num_computed_prefill_tokens)

    @torch.no_grad()  # as the runner's step
    def _execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        batch = self._prepare_inputs(so)
        model_inputs = {"input_ids": batch.input_ids, "positions": batch.positions,
                        **self.state.prepare_inputs(batch, self.req_states)}
        hidden = self._forward(batch, model_inputs["input_ids"], model_inputs["positions"])
        logits = self.state.compute_sample_logits(hidden[batch.logits_indices])
        out = self.sampler(logits, batch)
        rs = self.req_states
        post_update(batch.idx_mapping, rs.num_computed_tokens.gpu, rs.last_sampled_tokens,
                    self.sampler.penalties_state.output_bin_counts, out.sampled_token_ids, out.num_sampled,
                    out.num_rejected, batch.query_start_loc, rs.all_token_ids.gpu, rs.total_len.gpu)
        self.state.postprocess_state(batch.idx_mapping, out.num_sampled, rs.num_computed_tokens.gpu)
        sampled = out.sampled_token_ids.tolist()
        num_sampled = out.num_sampled.tolist()
        for req_id, n, logits_rows in zip(batch.req_ids, num_sampled, np.diff(batch.cu_num_logits_np), strict=True):
            if logits_rows:  # a window's forward (a prefill has no logits rows)
                self.trace.runs.setdefault(req_id, []).append(n)
        return ModelRunnerOutput(req_ids=batch.req_ids,
                                 sampled_token_ids=[row[:n] for row, n in zip(sampled, num_sampled, strict=True)],
                                 logprobs=None if out.logprobs_tensors is None else out.logprobs_tensors.tolists())

    def _prepare_inputs(self, so: SchedulerOutput) -> InputBatch:
        """The runner's gather_batch_req_state and prepare_inputs, for a batch without padding."""
        rs, buffers = self.req_states, self.buffers
        drafts = so.scheduled_spec_decode_tokens
        req_ids = sort_batch_req_ids(so.num_scheduled_tokens, drafts, self.canvas)
        num_reqs = len(req_ids)
        num_scheduled = np.array([so.num_scheduled_tokens[r] for r in req_ids], dtype=np.int32)
        num_drafts = np.array([len(drafts.get(r, ())) for r in req_ids], dtype=np.int32)
        # A canvas is whole (its request's width), or cut where max_model_len ends the window anyway
        # (WeDLMModelState), or a prompt of one token's first: that token's row alone, as vLLM
        # schedules a new request (scheduler.py).
        max_model_len = self.config.model_config.max_model_len
        for r, n in zip(req_ids, num_drafts, strict=True):
            request = self.scheduler.requests[r]
            whole = self.scheduler.canvas_width(request)
            assert n in (0, whole) or request.num_tokens + n >= max_model_len or n == request.num_tokens == 1
        idx_np = np.array([rs.req_id_to_index[r] for r in req_ids], dtype=np.intp)
        idx_mapping = torch.from_numpy(idx_np).to(torch.int64)
        num_tokens = int(num_scheduled.sum())
        cu_num_logits_np = np.concatenate([[0], np.cumsum(num_drafts)]).astype(np.int32)  # no bonus rows
        cu_num_logits = torch.from_numpy(cu_num_logits_np)
        total_logits = int(cu_num_logits_np[-1])
        expanded_idx, expanded_pos = expand_idx_mapping(idx_mapping, total_logits, cu_num_logits, self.canvas)
        qsl_np = np.full(rs.max_num_reqs + 1, num_tokens, dtype=np.int32)
        qsl_np[0] = 0
        np.cumsum(num_scheduled, out=qsl_np[1:num_reqs + 1])
        buffers.query_start_loc.copy_(torch.from_numpy(qsl_np))
        query_start_loc = buffers.query_start_loc[:num_reqs + 1]
        prefill_len_np = rs.prefill_len.np[idx_np]
        computed_prefill_np = rs.num_computed_prefill_tokens[idx_np]
        is_prefilling = computed_prefill_np < prefill_len_np
        if is_prefilling.any():
            prepare_prefill_inputs(buffers.input_ids, rs.next_prefill_tokens, idx_mapping, query_start_loc,
                                   rs.all_token_ids.gpu, rs.prefill_len.gpu, rs.num_computed_tokens.gpu)
        prepare_pos_seq_lens(idx_mapping, query_start_loc, rs.num_computed_tokens.gpu, buffers.positions,
                             buffers.seq_lens)
        seq_lens = buffers.seq_lens[:num_reqs]
        logits_indices = combine_sampled_and_draft_tokens(
            buffers.input_ids, idx_mapping, rs.last_sampled_tokens, query_start_loc, seq_lens, rs.prefill_len.gpu,
            rs.draft_tokens, cu_num_logits, total_logits, self.state.num_new_sampled_tokens_per_step)
        computed_np = rs.num_computed_tokens_np[idx_np]
        return InputBatch(
            req_ids=req_ids, num_reqs=num_reqs, num_reqs_after_padding=num_reqs, idx_mapping=idx_mapping,
            idx_mapping_np=idx_np, expanded_idx_mapping=expanded_idx, expanded_local_pos=expanded_pos,
            num_scheduled_tokens=num_scheduled, num_tokens=num_tokens, num_tokens_after_padding=num_tokens,
            num_draft_tokens=int(num_drafts.sum()), num_draft_tokens_per_req=num_drafts,
            query_start_loc=query_start_loc, query_start_loc_np=qsl_np[:num_reqs + 1], seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=torch.from_numpy(computed_np + num_scheduled), dcp_local_seq_lens=None,
            num_computed_tokens_np=computed_np, prefill_len_np=prefill_len_np,
            num_computed_prefill_tokens_np=computed_prefill_np, is_prefilling_np=is_prefilling,
            has_prefill=bool(is_prefilling.any()), decode_graph_eligible=not is_prefilling.any(),
            input_ids=buffers.input_ids[:num_tokens], positions=buffers.positions[:num_tokens],
            is_padding=buffers.is_padding[:num_tokens], logits_indices=logits_indices, cu_num_logits=cu_num_logits,
            cu_num_logits_np=cu_num_logits_np, has_structured_output_reqs=False, prompt_lens=None)

    def _forward(self, batch: InputBatch, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[num_tokens, H]: each request's rows after its committed tokens (the KV a cache holds)."""
        rs = self.req_states
        parts = []
        for i in range(batch.num_reqs):
            start, end = int(batch.query_start_loc_np[i]), int(batch.query_start_loc_np[i + 1])
            slot = int(batch.idx_mapping_np[i])
            history = rs.all_token_ids.gpu[slot, : int(rs.num_computed_tokens.gpu[slot])]
            parts.append(self.model.hidden(history, input_ids[start:end], positions[start:end]))
        return torch.cat(parts)
