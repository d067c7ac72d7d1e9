"""``WeDLMSampler``: the V2 runner's sampler for WeDLM windows, built on ``core``.

Given the logits of every canvas row (``WeDLMModelState.prepare_inputs`` planned them), it applies
each request's logit edits, draws a token for each row with its request's sampling settings (both
as the V1 binding does, with ``core``), fills the chosen masks of each window, drops its committed run and keeps the
next window in the table. The committed run (the leading filled slots the forward just wrote the
exact KV of) is what the step reports as sampled: ``post_update`` appends those tokens and advances
the request by their count, since every other canvas row counts as rejected. A prefill samples none.
A lossless window's run is verified against its own rows' draws first (a fill stands where its row
before drew it); it reports the fills it accepted and the token its run's last row drew.

vLLM's own sampler keeps its per-request state (the runner adds requests to it and reads its
penalty counts; this one reads its sampling settings), so this one wraps it and forwards those
calls. Log-probs come from the V1 binding's stage (``adapter/token_logprobs.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.worker.gpu.input_batch import InputBatch, get_num_sampled_and_rejected
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
from vllm.v1.worker.gpu.sample.output import SamplerOutput

from vllm_wedlm.adapter.token_logprobs import TokenLogprobs
from vllm_wedlm.core.batch import dense_drafts, fill_masks, leading_filled, slots_of_rows, verify_dense
from vllm_wedlm.core.logit_edits import edit_logits
from vllm_wedlm.core.sampling import SamplingBatch, sample
from vllm_wedlm.core.selection import row_entropy
from vllm_wedlm.v2.context_edits import apply_context_edits
from vllm_wedlm.v2.grammar_stage import CanvasGrammars
from vllm_wedlm.v2.window_table import WindowStep, WindowTable, canvas_width


class WeDLMSampler:
    def __init__(self, base: Any, table: WindowTable, current_step: Callable[[], WindowStep | None],
                 token_logprobs: TokenLogprobs, generators: dict[str, torch.Generator], grammars: CanvasGrammars):
        self.base = base  # vLLM's Sampler: per-request sampling state, penalties, log-prob ids
        self.table = table  # each slot's window and knobs
        self.current_step = current_step  # the model state's plan of this step's windows
        self.token_logprobs = token_logprobs  # the log-prob stage (both bindings')
        self.generators = generators  # seeded requests' own streams, by request id
        self.grammars = grammars  # the grammar stage (structured outputs)
        self.req_states = base.req_states
        self.penalties_state = base.penalties_state  # post_update counts the committed tokens in it

    def add_request(self, req_idx: int, sampling_params: Any) -> None:
        self.base.add_request(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        self.base.apply_staged_writes()

    def __call__(self, logits: torch.Tensor, input_batch: InputBatch) -> SamplerOutput:
        width = canvas_width(self.table.window_size)
        sampled = torch.zeros(input_batch.num_reqs, width, dtype=torch.int64, device=logits.device)
        num_sampled = torch.zeros(input_batch.num_reqs, dtype=torch.int32, device=logits.device)
        step = self.current_step()
        logprobs = None
        if step is not None:
            raw_logits = logits  # [N, V]: what log-probs read (vLLM's default); the edits' are a copy
            logits = self._thinking_budget(self._edited(logits, step), raw_logits, step)
            fill_first = None
            if any(record.grammar for record in step.records):
                logits = own_copy(logits, raw_logits)
                fill_first = self.grammars.mask_rows(logits, step)
            row_draws = sample(logits, self._sampling(step), self.table.mask_id)  # [N]: each row's draw
            if step.index is not None:  # before the windows move on: where each plain fill may go
                self._fill_rings(raw_logits, row_draws, step)
            tokens, count = self._finish_windows(logits, row_draws, step, fill_first)
            if fill_first is not None:
                self.grammars.follow(step, tokens, count)
            sampled[step.batch_index] = tokens
            num_sampled[step.batch_index] = count.to(torch.int32)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            num_sampled, input_batch.seq_lens, input_batch.cu_num_logits, input_batch.idx_mapping,
            self.req_states.prefill_len.gpu)
        if step is not None and step.index is not None:
            logprobs = self._returned_logprobs(raw_logits, tokens, count, num_sampled, step)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs, num_nans=None,
                             num_sampled=num_sampled, num_rejected=num_rejected)

    def _edited(self, logits: torch.Tensor, step: WindowStep) -> torch.Tensor:
        """The rows with their requests' edits, or as they are: allowed tokens, logit bias and
        min_tokens (``core/logit_edits.py``, the V1 binding's too), then bad words and penalties
        (``context_edits.py``), in the order of vLLM's AR sampler. min_tokens reads the output index
        each row predicts, the penalties the tokens before it: a mask row predicts its own slot, a
        lossless window's leading-run row (an AR row) the next one."""
        if all(record.edits is None and record.context_edits is None for record in step.records):
            return logits
        order = step.plan.order  # [B, C]: the slot each physical row feeds
        checks = torch.where(step.lossless, leading_filled(step.plan.windows.filled), 0)  # [B]
        ar_row = torch.arange(order.shape[1], device=order.device)[None] < checks[:, None]  # [B, C]
        committed = self.table.committed[step.slots]  # [B]: each window's start
        positions = (committed[:, None] + order + ar_row.long())[step.rows]  # [N]: the position each row predicts
        if any(record.edits is not None for record in step.records):
            row_window = np.repeat(np.arange(len(step.records)), step.widths)  # [N]
            prompt_len = self.req_states.prompt_len.gpu[step.slots].long()  # [B]
            output_index = positions - prompt_len[torch.from_numpy(row_window).to(logits.device)]
            logits = edit_logits(logits, [step.records[b].edits for b in row_window], output_index)  # a float32 copy
        else:  # a float32 copy, as vLLM's sampler edits (the raw logits stay for log-probs)
            logits = logits.to(torch.float32, copy=True)
        return apply_context_edits(logits, step, positions, committed, self.req_states, self.penalties_state)

    def _thinking_budget(self, logits: torch.Tensor, raw_logits: torch.Tensor, step: WindowStep) -> torch.Tensor:
        """The rows of requests with a thinking budget, with vLLM's own budget state applied (it
        forces the end of reasoning once the budget is spent), after every other edit, as vLLM's
        sampler applies it. Such a request is decoded AR (``config.decodes_ar``): its canvas is the
        one row of its unforwarded last token (a lossless window of one row), which predicts the
        position after every token vLLM holds for it, the row vLLM's AR step has."""
        budget = self.base.thinking_budget_state
        if not budget.enabled:
            return logits
        budgeted = np.flatnonzero(budget.use_thinking_budget[step.host_slots])  # [b] of the step's windows
        if not len(budgeted):
            return logits
        assert (step.widths[budgeted] == 1).all(), "a request with a thinking budget is decoded AR"
        logits = own_copy(logits, raw_logits)
        device = logits.device
        windows = torch.from_numpy(budgeted).to(device, non_blocking=True)
        rows = torch.from_numpy(np.cumsum(step.widths)[budgeted] - 1).to(device, non_blocking=True)  # [b]: their rows
        slots = step.slots[windows]  # [b]
        host_slots = step.host_slots[budgeted]
        picked = logits[rows]  # [b, V]
        budget.apply(picked, LogitsContext(
            expanded_idx_mapping=slots, idx_mapping=slots, idx_mapping_np=host_slots,
            expanded_local_pos=torch.zeros_like(slots), input_ids=step.plan.windows.tokens[windows, 0],
            pos=self.table.committed[slots],  # the row's own position: its token's, slot 0
            seq_lens_upper_bound_np=self.req_states.num_computed_tokens_np[host_slots] + 1))
        logits[rows] = picked
        return logits

    def _sampling(self, step: WindowStep) -> SamplingBatch:
        """Each canvas row's sampling settings, its request's (vLLM's per-request sampling state):
        temperature, top-k, top-p, min-p, and a seeded request's own stream. Every row but a lossless
        window's leading run (AR rows, which check its fills and draw its next token, as vLLM's
        sampler draws) never draws the mask token."""
        states, device = self.base.sampling_states, step.rows.device
        checks = torch.where(step.lossless, leading_filled(step.plan.windows.filled), 0)  # [B]
        ban = (torch.arange(step.rows.shape[1], device=device)[None] >= checks[:, None])[step.rows]  # [N]
        temperature = states.temperature.np[step.host_slots]  # [B]
        if not temperature.any():
            return SamplingBatch(None, None, None, ban)

        def per_row(values: np.ndarray, dtype: torch.dtype, off: float | None = None) -> torch.Tensor | None:
            """[N]: each window's value on each of its rows; None where every window's is ``off``."""
            if off is not None and (values == off).all():
                return None
            return torch.from_numpy(np.repeat(values, step.widths)).to(device, dtype, non_blocking=True)

        top_k = states.top_k.np[step.host_slots]
        first_row = np.cumsum(step.widths) - step.widths  # [B]
        return SamplingBatch(
            temperature=per_row(temperature, torch.float32),
            top_k=per_row(np.where(top_k >= states.vocab_size, 0, top_k), torch.int64, 0),
            top_p=per_row(states.top_p.np[step.host_slots], torch.float32, 1.0),
            ban_mask_token=ban, min_p=per_row(states.min_p.np[step.host_slots], torch.float32, 0.0),
            generators=[(int(first_row[b]), int(step.widths[b]), self.generators[req_id])
                        for b, req_id in enumerate(step.req_ids) if req_id in self.generators and temperature[b]])

    def _fill_rings(self, logits: torch.Tensor, row_draws: torch.Tensor, step: WindowStep) -> None:
        """The log-prob stage's rings: each row of a plain window that asks, at the mask slot it
        may fill (its absolute position; a row of a filled slot or of padding fills nothing)."""
        plan = step.plan
        order = plan.order  # [B, C]: the slot each physical row feeds
        asks = np.fromiter((record.logprobs for record in step.records), bool, len(step.records))
        asks = torch.from_numpy(asks & ~step.lossless_host).to(logits.device, non_blocking=True)  # [B]
        masked = ~plan.windows.filled.gather(1, order) & (order < plan.windows.length[:, None])  # [B, C]
        positions = torch.where(asks[:, None] & masked, self.table.committed[step.slots][:, None] + order, -1)
        self.token_logprobs.fill_rings(logits, row_draws, None, step.slots[:, None].expand_as(order)[step.rows],
                                       positions[step.rows], step.records, step.index.row_requests)

    def _returned_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor,
                           num_sampled: torch.Tensor, step: WindowStep) -> LogprobsTensors:
        """The entries of the tokens the step reports, request by request (vLLM's packing: each
        request's, in batch order, ``num_sampled`` of them): a plain window's run from its ring, a
        lossless window's tokens from its rows (the stage, ``adapter/token_logprobs.py``)."""
        columns = torch.arange(tokens.shape[1], device=tokens.device)[None]
        cells = torch.where(columns < count[:, None], tokens, -1)  # [Bw, C]
        plain = np.setdiff1d(np.arange(len(step.records)), step.index.lossless)
        entries = self.token_logprobs.returned(logits, cells, step.index, None, plain,
                                               self.table.committed[step.slots][torch.from_numpy(plain).to(cells.device)],
                                               step.records)
        kept = (columns < count[:, None]).flatten()  # the reported cells, window by window (batch order)
        cu = torch.cat([num_sampled.new_zeros(1), num_sampled.cumsum(0)])
        return LogprobsTensors(*(part[kept] for part in entries[:3]), cu_num_generated_tokens_tensor=cu)

    def _finish_windows(self, logits: torch.Tensor, row_draws: torch.Tensor, step: WindowStep,
                        fill_first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Verify the lossless windows' runs, fill the chosen masks of the step's windows from their
        own rows' draws (``row_draws`` [N]), drop the committed runs, and keep the next windows in
        the table. Returns what each window reports now ([B, C] tokens, [B] how many): a plain
        window its committed run, whose KV this forward wrote; a lossless one the fills it accepted
        after its slot 0 (a token it reported before) and the token its run's last row drew, its
        next slot 0."""
        plan, mask_id = step.plan, self.table.mask_id
        entropy = torch.zeros(step.rows.shape, dtype=torch.float32, device=logits.device)  # [B, C] per row
        drawn = torch.zeros(step.rows.shape, dtype=torch.int64, device=logits.device)
        entropy[step.rows] = row_entropy(logits)
        drawn[step.rows] = row_draws
        first_row = torch.zeros_like(plan.num_commit)
        drawn = slots_of_rows(drawn, plan.order, first_row)  # [B, C] per slot: the draw of its row
        verified, num_commit = None, plan.num_commit
        if step.lossless_host.any():  # (the device copy's .any() would wait for the forward)
            # Row j of a lossless window's leading run checks slot j + 1 (a fill): accepted where
            # its draw is that fill; the run's last row draws the next token.
            checks = torch.where(step.lossless, leading_filled(plan.windows.filled), 0)  # [B]
            accept = drawn == dense_drafts(plan.windows.tokens, checks)
            verified, num_commit = verify_dense(plan.windows, checks, accept, drawn,
                                                self.table.window_size_of[step.slots], mask_id)
        tau, lam = self.table.entropy_threshold[step.slots], self.table.pos_penalty[step.slots]  # [B] each
        windows = fill_masks(plan.windows, num_commit, slots_of_rows(entropy, plan.order, first_row), drawn,
                             tau, lam, mask_id, verified, fill_first)
        self.table.windows.store(step.slots, windows)
        if verified is None:
            return plan.windows.tokens, num_commit  # the committed runs lead
        reported = torch.where(step.lossless[:, None], verified.tokens.roll(-1, dims=1), plan.windows.tokens)
        return reported, num_commit


def own_copy(logits: torch.Tensor, raw_logits: torch.Tensor) -> torch.Tensor:
    """``logits`` to edit in place: a float32 copy (vLLM's sampler edits float32 logits) where they are
    still the forward's raw rows, which log-probs read; else as they are (an earlier stage's copy)."""
    return logits.to(torch.float32, copy=True) if logits is raw_logits else logits
