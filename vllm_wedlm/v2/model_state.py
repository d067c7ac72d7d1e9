"""``WeDLMModelState``: vLLM 0.34's ``ModelState`` for a WeDLM model on the V2 runner.

The runner calls it in this order each step: ``remove_request`` / ``add_request`` (slots),
``prepare_inputs`` (after the runner wrote prefill ids, sequential positions, slot mappings and the
rows to sample from), the forward, ``compute_sample_logits``, the sampler (``custom_sampler``),
then ``postprocess_state`` (after ``post_update`` advanced each request by its committed run).

A window's rows are its canvas: a decoding request is scheduled a fixed ``canvas_width`` placeholder
(draft) tokens and samples no token of its own (``num_new_sampled_tokens_per_step = 0``), so all
its rows are logits rows and a prefill has none. ``prepare_inputs`` writes the window into those
rows in physical order (filled slots first, then masks, then padding) and returns their logical
RoPE positions; the KV slot of a row stays its physical one (vLLM computed the slot mappings from
its own sequential positions before this hook), so the committed run's KV is exact.

A lossless window (and a per-request AR request's, a lossless window of one row) starts one token
earlier: its slot 0 is its unforwarded next token (the prompt's last, at first: ``scheduler.py``),
whose row draws what follows, and it keeps one slot past its canvas for that draw.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from vllm.config import VllmConfig
from vllm.v1.core.sched.output import NewRequestData
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.worker.gpu.input_batch import InputBatch
from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache
from vllm.v1.worker.gpu.model_states.default import DefaultModelState
from vllm.v1.worker.gpu.states import RequestState

from vllm_wedlm.adapter.grammar_rows import WindowGrammars
from vllm_wedlm.adapter.protocol import RequestKind, RequestRecord, classify
from vllm_wedlm.adapter.step_index import StepIndex
from vllm_wedlm.adapter.token_logprobs import TokenLogprobs
from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core.batch import plan_windows
from vllm_wedlm.v2.grammar_stage import CanvasGrammars
from vllm_wedlm.v2.sampler import WeDLMSampler
from vllm_wedlm.v2.scheduler import draws_from_ar_rows
from vllm_wedlm.v2.window_table import WindowStep, WindowTable, canvas_width


class WeDLMModelState(DefaultModelState):
    """vLLM's default model state (embeddings, attention metadata) plus the WeDLM window."""

    num_new_sampled_tokens_per_step = 0  # a window commits what it forwarded: no bonus token

    def __init__(self, vllm_config: VllmConfig, model: nn.Module, encoder_cache: EncoderCache | None,
                 device: torch.device):
        super().__init__(vllm_config, model, encoder_cache, device)
        canvas = vllm_config.num_speculative_tokens
        if canvas <= 0 or canvas % 2:
            raise ValueError(f"a WeDLM canvas is 2 W placeholder tokens (the diffusion canvas_length), got {canvas}")
        self.window_size = canvas // 2
        # The server's WeDLM settings: a fixed W of half the canvas, the default knobs (a request's own
        # over them, ``protocol.classify``).
        self.settings = WeDLMSettings(window_size=self.window_size, adaptive_window=False)
        self.records: dict[str, RequestRecord] = {}  # each running request's, from add_request
        mask_id = getattr(self.model_config.hf_config, "mask_token_id", None)
        if mask_id is None:
            raise ValueError("a WeDLM model's config names its mask_token_id")
        self.mask_id = int(mask_id)
        self.table = WindowTable(self.max_num_reqs, self.window_size, self.mask_id, device)
        # Logical RoPE positions of the step's rows (a static buffer, as graphs need).
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.long, device=device)
        self.step: WindowStep | None = None
        self.token_logprobs: TokenLogprobs | None = None  # the log-prob stage, made with the sampler
        self.kept_rings: OrderedDict[str, LogprobsTensors] = OrderedDict()  # removed requests' rings
        self.generators: OrderedDict[str, torch.Generator] = OrderedDict()  # seeded requests' streams
        self.grammars = WindowGrammars(vllm_config)  # structured-output requests' matchers, by request id

    def add_request(self, req_index: int, new_req_data: NewRequestData) -> None:
        super().add_request(req_index, new_req_data)
        seed = new_req_data.sampling_params.seed if new_req_data.sampling_params is not None else None
        if seed is not None and new_req_data.req_id not in self.generators:
            # Its own stream, kept while it waits after a preemption (as its window is), so its
            # tokens depend neither on its batch mates nor on preemption.
            self.generators[new_req_data.req_id] = torch.Generator(self.device).manual_seed(seed)
        # Its kind, knobs and per-row asks, read once (the V1 binding's ``classify``).
        record = self.records[new_req_data.req_id] = classify(new_req_data.sampling_params, self.settings)
        tokens = new_req_data.prefill_token_ids
        if record.grammar and new_req_data.req_id not in self.grammars:  # (a resumed one keeps its own)
            self.grammars.add(new_req_data.req_id, new_req_data.sampling_params, new_req_data.prompt_token_ids or [])
        if draws_from_ar_rows(record):
            # Its last token stays unforwarded, its window's slot 0 (``scheduler.py``): a per-request
            # AR request is a lossless window of one row.
            params = dataclasses.replace(record.params, lossless=True)
            window_size = (1 if record.kind is RequestKind.AR
                           else self.requested_window_size(new_req_data.sampling_params))
            self.table.add(req_index, new_req_data.req_id, len(tokens) - 1, window_size, params, tokens[-1])
        else:
            self.table.add(req_index, new_req_data.req_id, len(tokens),
                           self.requested_window_size(new_req_data.sampling_params), record.params)
        ring = self.kept_rings.pop(new_req_data.req_id, None)
        if ring is not None:
            self.token_logprobs.put_ring(req_index, ring)

    def requested_window_size(self, params: Any) -> int:
        """W of a request whose ``diffusion_canvas_length`` (the scheduler's canvas, at most the
        served one) is narrower: half its rows, at least one slot. A canvas of one row is a window
        of one slot forwarded alone (a fill, then its commit: the rows of a W 0 step, not its draw)."""
        extra = getattr(params, "extra_args", None) or {}
        width = extra.get("diffusion_canvas_length")
        if not width:
            return self.window_size
        return max(1, min(int(width), canvas_width(self.window_size)) // 2)

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)
        record, slot = self.records.pop(req_id, None), self.table.slot_of.get(req_id)
        if record is not None and record.logprobs and slot is not None and self.token_logprobs is not None:
            # A preempted request comes back in another slot: its ring of fills (the log-probs of
            # fills not returned yet) goes with it, kept as its window is (finished ones' dropped).
            ring = self.token_logprobs.ring(slot)
            if ring is not None:
                self.kept_rings[req_id] = ring
                while len(self.kept_rings) > self.max_num_reqs:
                    self.kept_rings.popitem(last=False)
        self.table.remove(req_id)
        if req_id in self.grammars:  # kept as its window is, while it may come back after a preemption
            for gone in [r for r in self.grammars.held() if r not in self.table.slot_of and r not in self.table.kept]:
                self.grammars.forget(gone)
        if req_id in self.generators:  # finished ones' dropped oldest first, as kept windows are
            self.generators.move_to_end(req_id)
            while len(self.generators) > 2 * self.max_num_reqs:
                self.generators.popitem(last=False)

    def prepare_inputs(self, input_batch: InputBatch, req_states: RequestState) -> dict[str, Any]:
        num_tokens = input_batch.num_tokens_after_padding
        positions = self.positions[:num_tokens]  # what a FULL graph reads (prepare_dummy_inputs)
        positions.copy_(input_batch.positions[:num_tokens])
        num_logits = np.diff(input_batch.cu_num_logits_np[: input_batch.num_reqs + 1])
        windowed = np.flatnonzero(num_logits > 0)  # requests with a canvas; prefills have no logits rows
        self.step = None
        if not len(windowed) or input_batch.req_ids[windowed[0]] not in self.table.slot_of:
            return {"positions": positions}  # no window, or a dummy batch (profiling, capture): no slot touched
        batch_index = torch.from_numpy(windowed).to(self.device)
        slots = input_batch.idx_mapping[batch_index]
        committed = req_states.num_computed_tokens.gpu[slots].long()
        width = torch.from_numpy(num_logits[windowed]).to(self.device)
        # A canvas is its request's 2 W rows (``requested_window_size``), cut short only at
        # max_model_len, where the window ends too; running requests
        # are scheduled first, so max_num_batched_tokens >= max_num_seqs * 2 W keeps the token
        # budget from cutting one (a cut window would lose the rows of its last slots).
        lossless = self.table.lossless[slots]  # [B]
        # A lossless window keeps a slot past its canvas for the token its run's last row draws (a
        # window of one row has no other); slots never reach max_model_len.
        limit = torch.clamp(committed + width + lossless.long(), max=self.max_model_len)
        plan = plan_windows(self.table.windows.rows(slots), self.table.window_size_of[slots], committed, limit)
        rows = torch.arange(canvas_width(self.window_size), device=self.device)[None] < width[:, None]  # [B, C]
        sampled_rows = input_batch.logits_indices  # the canvases' rows, request by request
        input_batch.input_ids[sampled_rows] = plan.input_ids[rows].to(input_batch.input_ids.dtype)
        positions[sampled_rows] = (committed[:, None] + plan.order)[rows]
        req_ids = [input_batch.req_ids[b] for b in windowed]
        records = [self.records[req_id] for req_id in req_ids]
        self.step = WindowStep(batch_index, slots, plan, rows, lossless, req_ids,
                               input_batch.idx_mapping_np[windowed].astype(np.int64), num_logits[windowed], records,
                               np.fromiter((draws_from_ar_rows(r) for r in records), bool, len(records)),
                               self._logprob_index(input_batch, windowed, num_logits[windowed], records))
        return {"positions": positions}

    def _logprob_index(self, input_batch: InputBatch, windowed: np.ndarray, widths: np.ndarray,
                       records: list[RequestRecord]) -> StepIndex | None:
        """Where the step's rows are for the log-prob stage, when one of its windows' requests asks:
        each canvas's rows are its request's logits rows, in physical order, so a lossless window's
        leading run (its checks) starts at its first; a lossless window returned its slot 0 when
        its row drew it."""
        if not any(record.logprobs for record in records):
            return None
        lossless = np.flatnonzero([draws_from_ar_rows(record) for record in records])  # [Bl] among the windows
        first_row = np.cumsum(widths) - widths  # [Bw]
        none = np.zeros(0, np.int64)
        return StepIndex(input_batch.idx_mapping_np[windowed].astype(np.int64), lossless, first_row[lossless], none,
                         none, np.zeros(len(windowed), bool), np.repeat(np.arange(len(windowed)), widths),
                         returns_slot0=False)

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        # A FULL graph is captured with these buffers and replays reading them: the logical
        # positions must live in the buffer prepare_inputs writes.
        return {**super().prepare_dummy_inputs(num_reqs, num_tokens), "positions": self.positions[:num_tokens]}

    def postprocess_state(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor,
                          num_computed_tokens: torch.Tensor | None = None) -> None:
        if num_computed_tokens is not None:
            live = idx_mapping[idx_mapping >= 0]
            self.table.committed[live] = num_computed_tokens[live].long()

    def custom_sampler(self, sampler: Any) -> tuple[WeDLMSampler, None]:
        refuse_custom_processors(sampler.logits_processors)
        self.token_logprobs = TokenLogprobs(self.model_config.max_logprobs, self.table,
                                            self.model_config.get_vocab_size())
        return WeDLMSampler(sampler, self.table, lambda: self.step, self.token_logprobs, self.generators,
                            CanvasGrammars(self.grammars, self.table)), None


def refuse_custom_processors(processors: list) -> None:
    """``ValueError`` at start-up naming each logits processor beyond vLLM's built-in ones (logit bias,
    penalties, bad words: the WeDLM sampler applies their settings itself) and the plugin's request
    validator: the V2 binding does not apply custom processors to canvas rows yet, and an engine
    that ignored them would serve requests as if they had run."""
    from vllm.v1.worker.gpu.sample.bad_words import BadWordsState
    from vllm.v1.worker.gpu.sample.logit_bias import LogitBiasState
    from vllm.v1.worker.gpu.sample.penalties import PenaltiesState

    from vllm_wedlm.v2.request_validator import WeDLMRequestValidator

    known = (LogitBiasState, PenaltiesState, BadWordsState, WeDLMRequestValidator)
    custom = [type(p).__module__ + "." + type(p).__qualname__ for p in processors if not isinstance(p, known)]
    if custom:
        raise ValueError(f"Not supported yet with WeDLM decoding on vLLM 0.34 (Model Runner V2): custom logits "
                         f"processors ({', '.join(custom)}); start without them (--logits-processors, or a "
                         f"plugin of the vllm.logits_processors entry point), or use vLLM 0.26")
