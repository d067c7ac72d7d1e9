"""How a WeDLM step lays out its rows: the interface of the two layouts, and what they share.

The runner (``model_runner.py``) picks one layout at start-up, from the engine's settings, and
hands it the three moments of a step that differ between them:

* ``ExactRows`` (``exact_rows.py``): each window forwards exactly its own slots, laid out from the
  host's copy of the window table, and the step copies its results to the host once. vLLM's
  synchronous scheduling, on the CPU and for a host-bound model on a GPU.
* ``FixedRows`` (``fixed_rows.py``): each window forwards up to 2W rows laid out on the device, and
  the step never waits for the host, so vLLM's async scheduling can plan the next step while this
  one runs. The default on a GPU for a model whose forward hides the host's work.

A layout never changes while the engine runs: the scheduler that matches it is chosen with it
(``config_hook.py``), and the two disagree on what a step returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.context_edits import RowContextEdits
from vllm_wedlm.adapter.custom_processors import RowContext, apply_custom, edit_in_batch_order
from vllm_wedlm.adapter.protocol import plan_of
from vllm_wedlm.adapter.step_index import StepIndex
from vllm_wedlm.adapter.step_rows import RequestState, StepRows
from vllm_wedlm.adapter.token_logprobs import TokenLogprobs
from vllm_wedlm.core.batch import WindowBatch, plan_windows
from vllm_wedlm.core.logit_edits import edit_logits
from vllm_wedlm.core.sampling import SamplingBatch

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_wedlm.adapter.grammar_rows import GrammarRows


@dataclass
class ScheduledBatch:
    """vLLM's input batch of a step as both layouts read it ([B] arrays, batch order)."""

    req_ids: list[str]
    states: list[RequestState]
    slots: np.ndarray  # int64, WindowTable slot
    autoregressive: np.ndarray  # bool: decoded AR on this engine (wedlm_decoding: ar)
    window: np.ndarray  # bool: the scheduler sent drafts, the request's window
    num_drafts: np.ndarray  # int64: draft tokens scheduled
    n: np.ndarray  # int64: rows forwarded
    starts: np.ndarray  # int64: the request's first row in the step
    computed: np.ndarray  # int64: vLLM's num_computed_tokens (with fixed rows, a bound in a window)
    window_sizes: np.ndarray  # int64: W of each window planned this step (the scheduler's, else the server's)


def ragged_arange(counts: np.ndarray) -> np.ndarray:
    """[sum(counts)] int64: 0..counts[0]-1, 0..counts[1]-1, ... (the index inside each segment)."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)


class RowLayout:
    """The part of a WeDLM step that depends on how windows lay out their rows.

    A subclass implements ``prepare`` and ``sample`` and may change the other three hooks. It reads
    and writes vLLM's input buffers through ``runner`` (the model runner it serves) and keeps the
    windows in the runner's ``WindowTable``.
    """

    # Whether windows forward a fixed number of rows (what ``window_step.compiled_window_step`` compiles).
    fixed_rows = False
    # Whether vLLM may run a step with no window and no prefill chunk whole, as its own AR step
    # (``WeDLMRunnerMixin._hands_step_to_vllm``): the layout keeps no state of such a step.
    vllm_ar_steps = False

    def __init__(self, runner, window_step):  # runner: model_runner.WeDLMRunnerMixin
        self.runner = runner
        self.settings = runner.wedlm
        self.table = runner.wedlm_table
        self.mask_id = runner.wedlm_mask_id
        self.device = runner.device
        self.max_model_len = runner.max_model_len
        self.window_step = window_step  # the step's device work (``window_step.py``); compiled on a GPU
        self.step: StepRows | None = None  # the step in flight, from ``prepare`` to ``sample``
        self.context_edits = RowContextEdits(self)
        self.token_logprobs = TokenLogprobs(runner.model_config.max_logprobs, self.table,
                                            runner.model_config.get_vocab_size())
        self.grammar_output = None  # the step's structured-output masks (vLLM's GrammarOutput), if any

    # The interface, in the order vLLM calls it.
    def waits_only(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether the runner may skip vLLM's batch update for this step (a step that changes nothing)."""
        return False

    def prepare(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray) -> tuple:
        """After vLLM's ``_prepare_inputs``: plan first windows, write the window rows' positions (and
        input ids where the layout lays them out), and return the step's logits rows (device row
        indices) and None, as vLLM's ``_prepare_inputs`` returns them."""
        raise NotImplementedError

    def before_input_ids(self) -> None:
        """Before vLLM's ``_prepare_input_ids``."""

    def sample(self, logits: torch.Tensor | None) -> SamplerOutput:
        """The step's WeDLM work on its logits rows, in place of vLLM's sampler."""
        raise NotImplementedError

    def vllm_sampled(self) -> None:
        """vLLM ran the step as its own AR step (``vllm_ar_steps``): before ``runner_output``."""

    def runner_output(self, output: ModelRunnerOutput) -> ModelRunnerOutput:
        """What the runner returns to the scheduler for the step (vLLM's, or more)."""
        return output

    def counts(self) -> dict[str, int]:
        """The layout's own counters (``WeDLMWorkerMixin.wedlm_row_layouts``)."""
        return {}

    # What both layouts use.
    def scheduled(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray) -> ScheduledBatch:
        """The step's input batch, once vLLM's ``_prepare_inputs`` has laid it out."""
        runner = self.runner
        num_reqs = runner.input_batch.num_reqs
        req_ids = runner.input_batch.req_ids[:num_reqs]
        states = [runner._request_state(req_id) for req_id in req_ids]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        chosen = plan_of(scheduler_output).window_sizes
        window_size = self.settings.window_size
        return ScheduledBatch(
            req_ids=list(req_ids), states=states,
            slots=np.fromiter((s.slot for s in states), np.int64, num_reqs),
            autoregressive=np.fromiter((s.autoregressive for s in states), bool, num_reqs),
            window=np.fromiter((req_id in drafts for req_id in req_ids), bool, num_reqs),
            num_drafts=np.fromiter((len(drafts.get(req_id, ())) for req_id in req_ids), np.int64, num_reqs),
            n=num_scheduled_tokens[:num_reqs].astype(np.int64),
            starts=runner.query_start_loc.np[:num_reqs].astype(np.int64),
            computed=runner.input_batch.num_computed_tokens_cpu[:num_reqs].astype(np.int64),
            window_sizes=np.fromiter((chosen.get(req_id, window_size) for req_id in req_ids), np.int64, num_reqs))

    def prompt_ends(self, step: StepRows) -> tuple[list[RequestState], np.ndarray, np.ndarray]:
        """The step's request states, and which WeDLM-decoded rows finished a prompt with it (or the
        token an AR step drew; not those stepping AR now, which draw): ``new`` ([B] bool) starts its
        first window now; ``resumed`` ([B] bool) was re-prefilled after a preemption and keeps the
        window it had."""
        states = [self.runner.wedlm_requests[req_id] for req_id in step.req_ids]
        has_window = np.fromiter((s.has_window for s in states), bool, len(states))
        windowed = step.completes_prefill & ~step.autoregressive & ~step.ar_next
        return states, windowed & ~has_window, windowed & has_window

    def step_index(self) -> StepIndex:
        """Where this layout placed the step's logits rows (``StepIndex``)."""
        raise NotImplementedError

    def grammar_rows(self, plain: np.ndarray, verified: np.ndarray, first: np.ndarray) -> GrammarRows:
        """Where the step's windows under a grammar draw (``grammar_rows.GrammarRows``): the first mask
        of each ``plain`` window ([B] bool), the checks of each ``verified`` (lossless) one, and the
        ``first`` ([B] bool) lossless requests' first-token rows."""
        raise NotImplementedError

    def edited_rows(self, logits: torch.Tensor | None, states: list[RequestState]) -> tuple:
        """The step's logits rows ([N, V]) before the draws: masked by the grammar stage (in place: the
        raw rows, which log-probs read, vLLM's default), then edited by each request's edits and the
        thinking budget (a float32 copy). Returns (raw rows, edited rows, and [B] bool: plain windows
        under a grammar, lossless ones, plain ones whose first slot the grammar masks)."""
        step, grammars = self.step, self.runner.wedlm_grammars
        index = self.step_index()
        # [B] each: plain windows, lossless ones, first tokens under a grammar; plain ones it masks
        plain, verified, first, masked = grammars.kinds(step, states)
        if logits is not None and (self.grammar_output is not None or (masked | verified | first).any()):
            grammars.mask_rows(logits, self.grammar_output, step.req_ids, index,
                               self.grammar_rows(masked, verified, first))
        raw_logits = logits
        if logits is not None and len(index.row_requests):
            logits = self.edited(logits, states, index.row_requests)
        logits = self.end_thinking(logits, lambda: index.ar_draws()[1])
        return raw_logits, logits, plain, verified, masked

    def edited(self, logits: torch.Tensor, states: list[RequestState], row_requests: np.ndarray) -> torch.Tensor:
        """``logits`` [N, V] with each request's allowed tokens, logit bias and min_tokens applied to
        its rows (``row_requests`` [N]: each row's index into ``states``, the persistent batch's
        order), then its bad words, the engine's custom logits processors and its penalties, as
        float32, in vLLM's order; unchanged (no copy) when nothing applies."""
        edited = any(state.edits is not None for state in states)
        in_context = any(state.context_edits is not None for state in states)
        processors = self.runner.wedlm_custom_processors
        if not edited and not in_context and not processors:
            return logits
        output_index = None
        if any(state.edits is not None and state.edits.min_tokens for state in states):
            output_index = self.row_positions() - torch.from_numpy(self.prompt_lengths()[row_requests]).to(
                self.device, non_blocking=True)
        logits = (edit_logits(logits, [states[i].edits for i in row_requests], output_index) if edited
                  else logits.to(torch.float32, copy=True))

        def custom(rows: torch.Tensor) -> torch.Tensor:  # after bad words, before penalties (vLLM's place)
            if not processors:
                return rows
            return apply_custom(processors, rows, row_requests, self.row_contexts(row_requests),
                                self.runner.input_batch.req_output_token_ids)

        return self.context_edits.apply(logits, states, row_requests, custom) if in_context else custom(logits)

    def end_thinking(self, logits: torch.Tensor | None,
                     next_token_rows: Callable[[], np.ndarray]) -> torch.Tensor | None:
        """``logits`` with vLLM's thinking budgets applied, after penalties as in vLLM's sampler: a
        request with a ``thinking_token_budget`` decodes AR (``config.decodes_ar``), and vLLM's own
        budget state (its input batch's, which follows the batch) forces the end of its thinking at
        its next-token row (``next_token_rows()`` [Ba], one per request at ``step.ar_next``, in batch
        order; asked only in a step with a budget) once the budget is spent. Its state reads the
        requests' output lists every step, as vLLM's sampler has it do; under async scheduling a
        list ends with placeholders for the step in flight, which vLLM's own call fills from that
        step's sampled tokens first (it waits for their copy to the host, as vLLM's runner does
        before penalties or budgets)."""
        holder = self.runner.input_batch.thinking_budget_state_holder
        if holder is None or not holder.has_tracked_requests():
            return logits
        self.runner.input_batch.update_async_output_token_ids()
        lists = self.runner.input_batch.req_output_token_ids
        holder.update_state(lists, None)
        requests = np.flatnonzero(self.step.ar_next)  # [Ba]: one next-token row each
        if logits is None or not len(requests):
            return logits
        logits = logits.to(torch.float32, copy=True)  # float32 as vLLM's sampler; the raw rows stay for log-probs
        return edit_in_batch_order(logits, next_token_rows(), requests, len(lists),
                                   lambda batch: holder.apply_to_logits(batch, predict_bonus_token=False,
                                                                        spec_token_ids=None))

    def prompt_lengths(self) -> np.ndarray:
        """[B] int64: the prompt length of each request of the step."""
        return np.fromiter((self.runner.requests[req_id].num_prompt_tokens for req_id in self.step.req_ids),
                           np.int64, len(self.step.req_ids))

    def window_starts(self, slots: np.ndarray) -> torch.Tensor:
        """[P] int64 on the device: where the windows forwarded now at ``slots`` start."""
        raise NotImplementedError

    def row_contexts(self, row_requests: np.ndarray) -> list[RowContext]:
        """Each logits row's context for the custom logits processors (``custom_processors.py``): how
        much of its request's output list it sees, then the window tokens after it, up to the row's
        position; ``row_requests`` [N] as in ``edited``. Only a layout that knows its windows on the
        host has them (the engine refuses custom processors otherwise)."""
        raise NotImplementedError

    def row_positions(self) -> torch.Tensor:
        """[N] int64 on the device: the position of the token each logits row of the step predicts (a
        mask row its own slot's, a next-token row the one after its own); asked for min_tokens,
        penalties and bad words."""
        raise NotImplementedError

    def trace(self, req_ids: list[str], rows, window_sizes: np.ndarray) -> None:
        """Record W for the windows of the batch ``rows`` planned now (``window_sizes`` [B]), while a
        trace is on."""
        trace = self.runner.wedlm_window_trace
        if trace is not None:
            for row in rows:
                trace.setdefault(req_ids[row], []).append(int(window_sizes[row]))

    def on_device(self, values: np.ndarray) -> torch.Tensor:
        """A host array on the device, behind the work queued there (no host sync)."""
        return torch.from_numpy(values).to(self.device, non_blocking=True)

    def rows(self, values: torch.Tensor, chosen: np.ndarray) -> torch.Tensor:
        """The ``chosen`` ([N] bool, host) rows of ``values`` ([N, ...], device); no copy when all are."""
        if chosen.all():
            return values
        return values[torch.from_numpy(np.flatnonzero(chosen)).to(self.device, non_blocking=True)]

    def start_windows(self, req_ids: list[str], states: list[RequestState], first: np.ndarray,
                      committed_len: np.ndarray, window_sizes: np.ndarray) -> None:
        """Plan the first window of the ``first`` ([B] bool) requests, which start after
        ``committed_len`` ([B]) tokens: empty windows of ``window_sizes`` ([B], the W the scheduler
        sized them by), planned on the host as ``sample`` plans them after a prefill
        (``core.batch.plan_windows``), then kept in the table."""
        rows = np.flatnonzero(first)
        if any(states[row].params.lossless for row in rows):
            raise RuntimeError(f"lossless WeDLM request {req_ids[rows[0]]} got a window before its first token")
        starts = committed_len[rows]
        plan = plan_windows(WindowBatch.empty(len(rows), self.table.capacity, self.mask_id),
                            torch.from_numpy(window_sizes[rows]), torch.from_numpy(starts), self.max_model_len)
        self.table.start(np.array([states[row].slot for row in rows], np.int64), plan, starts)
        for row in rows:
            states[row].window_size = int(window_sizes[row])
        self.trace(req_ids, rows, window_sizes)

    def sampling_batch(self, counts: np.ndarray, num_ar_rows: np.ndarray) -> SamplingBatch:
        """Per-row sampling settings of ``counts[i]`` ([B]) logits rows of each request of the step, the
        first ``num_ar_rows[i]`` of them next-token rows, from vLLM's input batch."""
        meta = self.runner.input_batch.sampling_metadata
        # Mask rows never draw the mask token; a next-token row may (as in --decoding ar).
        ar_rows = ragged_arange(counts) < np.repeat(num_ar_rows, counts)  # [N]
        ban = torch.from_numpy(~ar_rows).to(self.device, non_blocking=True) if ar_rows.any() else None
        if meta.all_greedy:
            return SamplingBatch(None, None, None, ban)
        rows = torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).to(self.device, non_blocking=True)
        starts = np.cumsum(counts) - counts
        requests = self.runner.wedlm_requests
        min_p = np.fromiter((requests[req_id].min_p for req_id in self.runner.input_batch.req_ids[:len(counts)]),
                            np.float32, len(counts))  # [B]
        return SamplingBatch(
            temperature=meta.temperature[rows],
            top_k=None if meta.top_k is None else meta.top_k[rows].long(),
            top_p=None if meta.top_p is None else meta.top_p[rows].float(),
            ban_mask_token=ban,
            min_p=torch.from_numpy(np.repeat(min_p, counts)).to(self.device, non_blocking=True) if min_p.any()
            else None,
            generators=[(int(starts[row]), int(counts[row]), gen) for row, gen in meta.generators.items()
                        if row < len(counts) and counts[row]],
        )
