"""Fixed window rows (``row_layout.py``): what vLLM's async scheduling runs.

Under async scheduling vLLM schedules step n+1 while step n runs, so neither the scheduler nor the
host knows a window's slots when its rows are laid out. Each window therefore forwards up to 2W
rows (``scheduler.FixedRowsScheduler`` decides how many) whose input ids and positions are
gathered from the device table, and a step's WeDLM work (``window_step.fixed_rows_window_step``)
reads and writes only that table: no device-to-host copy, so the host runs ahead. What a step
returns (each window's leading run, an AR request's draw) goes back as vLLM's sampled tokens, a
device tensor that vLLM copies to the host after the next step is launched.

A window under a structured output's grammar (``grammar_rows.py``) is the exception: its rows are
masked where the device says they are, but the grammar lives on the host, which must see each run
the step returns to cut it where the grammar rejects a fill (plain) or to follow it (lossless),
before vLLM does. Such a step waits for its device work once; vLLM's async engine already defers
the sampling of a step with a structured output until the step before has come back.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import AsyncModelRunnerOutput, LogprobsTensors, ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.grammar_rows import GrammarRows
from vllm_wedlm.adapter.outputs import AsyncOutputWithSpans, with_window_spans
from vllm_wedlm.adapter.protocol import plan_of
from vllm_wedlm.adapter.row_layout import RowLayout, ragged_arange
from vllm_wedlm.adapter.step_index import StepIndex
from vllm_wedlm.adapter.step_rows import StepRows
from vllm_wedlm.adapter.window_step import check_rows, fixed_rows_window_step, leading_runs, zero_window_step
from vllm_wedlm.config import max_window_tokens
from vllm_wedlm.core.batch import WindowBatch, drop_leading, leading_filled, plan_windows
from vllm_wedlm.core.sampling import sample

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


def only_waits(scheduler_output: SchedulerOutput) -> bool:
    """Whether a step schedules nothing and changes no request (a step of async scheduling that
    only waits for the one in flight)."""
    return not (scheduler_output.total_num_scheduled_tokens or scheduler_output.finished_req_ids
                or scheduler_output.preempted_req_ids or scheduler_output.free_encoder_mm_hashes
                or scheduler_output.new_block_ids_to_zero or scheduler_output.kv_cache_block_copies)


class FixedRows(RowLayout):
    """Fixed window rows under vLLM's async scheduling (``row_layout.py``)."""

    fixed_rows = True

    def __init__(self, runner, window_step):
        super().__init__(runner, window_step)
        # The step's windows: slots, leading runs, starts and rows (device, [Bw] each), whether all
        # forwarded 2W rows, and which are lossless (device [Bw] bool, or None when none is).
        self.forwarded: tuple = ()
        # R, the logits rows of each window of the step (``logits_rows_per_window``).
        self.rows_per_window = 0
        # Each AR-decoded request's last draw, per slot (the next step's input).
        self.ar_draws = torch.zeros(runner.max_num_reqs, dtype=torch.long, device=self.device)
        # Steps whose windows the scheduler's gate padded to their longest possible run ("padded":
        # 2W rows at a fixed W) and the others ("exact": each window's own run's rows, or a predicted
        # run's), and the windows that were void for a step (their run outgrew the prediction),
        # counted on the device.
        self.layouts: Counter[str] = Counter()
        self.void_windows = torch.zeros((), dtype=torch.long, device=self.device)
        # Steps that scheduled nothing and only waited for the one in flight (``waits_only``): each
        # holds a place in vLLM's batch queue of two, so the next forward cannot start under it.
        self.waits = 0
        # Windows of W 0 re-prefilled after a preemption, which drew from their last row.
        self.redrawn = 0
        # W of each window's next plan in the step (device [Bw]).
        self.window_sizes: torch.Tensor | None = None
        # The step's windows of W 0 (their leading run alone: each draws its next token from the
        # run's last row), as a host and a device [Bw] bool; None in a step without one.
        self.zero_windows: tuple[np.ndarray, torch.Tensor] | None = None
        # With the adaptive window: the step's windows' requests and the slots after the leading run of
        # the window it planned for each (device [Bw] int32), for the scheduler (``runner_output``).
        self.spans: tuple[list[str], torch.Tensor] | None = None

    def waits_only(self, scheduler_output: SchedulerOutput) -> bool:
        # Async scheduling's step that waits for the one in flight (the scheduler's gate holds its
        # windows back): vLLM would take every request out of the persistent batch, as unscheduled,
        # only to add them all again next step (host work that grows with the batch).
        waits = only_waits(scheduler_output)
        self.waits += waits
        return waits

    def counts(self) -> dict[str, int]:
        # (int(void_windows): one device sync, here)
        return {**self.layouts, "void_windows": int(self.void_windows), "waits": self.waits,
                "w0_redrawn": self.redrawn}

    def prepare(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray) -> tuple:
        """Each window's rows, up to Q = 2W, laid out from the device table (the host may not know the
        window yet, when the step before is still running). Its logits rows are R per window
        (``logits_rows_per_window``):
        a plain window's R after its leading run, which hold every mask row unless the window is void
        (given fewer rows than it has, for a run longer than the scheduler predicted:
        ``fixed_rows_window_step``); a lossless window's first R, its whole window (the scheduler gives
        it Q rows). Then the last row of each request that draws a next token: an AR-decoded one
        (``ar_input_ids``), and a lossless one whose prompt ended (its window's slot 0)."""
        runner = self.runner
        batch = self.scheduled(scheduler_output, num_scheduled_tokens)
        req_ids, states, slots, autoregressive = batch.req_ids, batch.states, batch.slots, batch.autoregressive
        window, n, starts, computed, num_drafts = batch.window, batch.n, batch.starts, batch.computed, batch.num_drafts
        num_reqs = len(req_ids)
        lossless = np.fromiter((s.params.lossless for s in states), bool, num_reqs) & ~autoregressive  # [B]
        has_window = np.fromiter((s.has_window for s in states), bool, num_reqs)  # [B]
        first = window & ~has_window  # [B]: a first window, after its prompt's last rows
        prompt_rows = np.where(first, n - num_drafts, 0)  # [B]
        if first.any():
            self.start_windows(req_ids, states, first, computed + prompt_rows, batch.window_sizes)
        if (window & autoregressive).any():
            raise RuntimeError(f"AR request {req_ids[int(np.argmax(window & autoregressive))]} on a WeDLM engine "
                               "got draft tokens")
        completes_prefill = ~window & (computed + n >= runner.input_batch.num_tokens_no_spec[:num_reqs])
        ar_next = completes_prefill & autoregressive  # [B] draws its next token from its last row
        held_zero = np.fromiter((s.window_size == 0 for s in states), bool, num_reqs)  # [B] holds a W 0 window
        # [B] draws its window's slot 0 from its last row: a lossless request after its prompt, and a
        # request re-prefilled after a preemption that held a window of W 0 (its leading run, now
        # re-prefilled: its last row is the one the W 0 window would have drawn from).
        first_token = completes_prefill & ((lossless & ~has_window) | (held_zero & has_window & ~lossless
                                                                        & ~autoregressive))
        plan = plan_of(scheduler_output)
        rows_per_window = self.logits_rows_per_window(window & lossless, (n - prompt_rows)[window], plan.mask_rows)
        self.rows_per_window = rows_per_window
        self.step = StepRows(list(req_ids), slots, autoregressive, window, completes_prefill, lossless,
                                    ar_next, first_token, computed + n,
                                    np.where(window, rows_per_window, (ar_next | first_token).astype(np.int64)),
                                    np.zeros(num_reqs, np.int64), batch.window_sizes)
        ar_rows = self.ar_input_ids(req_ids, slots, autoregressive, ar_next | first_token, starts, n)  # [Bd] device
        b = np.flatnonzero(window)  # [Bw] batch rows of windows
        self.logits_rows, self.window_logits = ar_rows, 0  # [N] device rows; how many are windows'
        self.zero_windows = None
        if not len(b):
            return ar_rows, None
        return self._lay_out_windows(scheduler_output, batch, prompt_rows, has_window, held_zero, lossless,
                                     ar_rows), None

    def _lay_out_windows(self, scheduler_output: SchedulerOutput, batch, prompt_rows: np.ndarray,
                         has_window: np.ndarray, held_zero: np.ndarray, lossless: np.ndarray,
                         ar_rows: torch.Tensor) -> torch.Tensor:
        """Write the forwarded windows' rows from the device table (input ids, positions, KV slots
        from each window's real start) and return the step's logits rows ([N] device: R per window,
        then ``ar_rows``). ``batch``: ``scheduled``'s; ``prompt_rows`` [B]: a first window's
        prompt rows before it; ``has_window`` / ``held_zero`` / ``lossless`` [B] bool."""
        runner, table, plan = self.runner, self.table, plan_of(scheduler_output)
        req_ids, slots, n, starts = batch.req_ids, batch.slots, batch.n, batch.starts
        num_reqs, rows_per_window = len(req_ids), self.rows_per_window
        b = np.flatnonzero(batch.window)  # [Bw] batch rows of windows
        rows = n[b] - prompt_rows[b]  # [Bw] window rows: Q when pipelined, else each window's own
        q = max_window_tokens(self.settings.window_size)
        for i in np.flatnonzero(rows > q):
            # The layout below indexes the table by these rows on the device: say which request,
            # rather than a device-side index assert later.
            raise RuntimeError(f"WeDLM request {req_ids[b[i]]}: {rows[i]} window rows scheduled, more than "
                               f"2W = {q} (fixed window rows)")
        full = True  # every window 2W rows: none can be void
        if has_window[b].any():  # a first window forwards its W masks after the prompt either way
            full = bool((rows[has_window[b]] == q).all())
            # The layout is the gate's choice: an adaptive window it pads forwards its own S + W rows,
            # fewer than 2W.
            self.layouts["padded" if (full if plan.padded is None else plan.padded) else "exact"] += 1
        first_row = starts[b] + prompt_rows[b]  # [Bw] each window's first row in the step
        row_of = np.repeat(np.arange(len(b)), rows)  # [Tw] which window each window row is of
        # One copy: each window's slot, batch row, first row, rows, prompt rows, whether lossless, W
        # of its plan at the step's end and whether it is a window of W 0; each window row's index
        # and window.
        zero = held_zero[b] & has_window[b]  # [Bw] windows of W 0
        head = np.stack([slots[b], b, first_row, rows, prompt_rows[b], lossless[b], batch.window_sizes[b], zero])
        index = torch.from_numpy(np.concatenate([head.ravel(), np.repeat(first_row, rows) + ragged_arange(rows),
                                                 row_of])).to(self.device, non_blocking=True)
        w_slots, w_batch, w_first, w_rows, w_prompt, w_lossless, self.window_sizes, w_zero = (
            index[: 8 * len(b)].view(8, len(b)))
        flat_rows, flat_window = index[8 * len(b):].view(2, -1)
        self.zero_windows = (zero, w_zero.bool()) if zero.any() else None
        flat_i = flat_rows - w_first[flat_window]  # [Tw] physical row inside its window
        start = table.committed_len[w_slots]  # [Bw] tokens before each window (its KV frontier)
        # Physical positions (KV slots) from the window's real start, then RoPE's logical ones.
        runner.num_computed_tokens[w_batch] = (start - w_prompt).to(runner.num_computed_tokens.dtype)
        total = scheduler_output.total_num_scheduled_tokens
        runner.positions[:total] = (runner.num_computed_tokens[runner.req_indices.gpu[:total]].to(torch.int64)
                                  + runner.query_pos.gpu[:total])
        runner.seq_lens[:num_reqs] = runner.num_computed_tokens[:num_reqs] + runner.num_scheduled_tokens.gpu[:num_reqs]
        runner.input_batch.block_table.compute_slot_mapping(num_reqs, runner.query_start_loc.gpu[: num_reqs + 1],
                                                          runner.positions[:total])
        order = table.order[w_slots[flat_window], flat_i]  # [Tw] the slot fed at each window row
        runner.positions[flat_rows] = start[flat_window] + order
        input_ids = table.windows.tokens[w_slots[flat_window], order]  # [Tw]
        runner.input_ids.gpu[flat_rows] = input_ids.to(runner.input_ids.gpu.dtype)
        # Logits: R rows of each window, in physical order: a plain window's after its leading run
        # (its masks are among them), a lossless window's from its first (its leading run checks).
        run = leading_filled(table.windows.filled[w_slots])  # [Bw]
        w_lossless = w_lossless.bool() if (batch.window & lossless).any() else None  # [Bw]
        from_row = run if w_lossless is None else torch.where(w_lossless, 0, run)  # [Bw]
        if self.zero_windows is not None:  # a W 0 window's one row: its run's last, a next-token row
            from_row = torch.where(self.zero_windows[1], run - 1, from_row)
        k = torch.arange(rows_per_window, device=self.device)[None]  # [1, R]
        logits_rows = w_first[:, None] + torch.minimum(from_row[:, None] + k, w_rows[:, None] - 1)  # [Bw, R]
        self.forwarded = (w_slots, run, start, w_rows, full, w_lossless)
        self.logits_rows, self.window_logits = torch.cat([logits_rows.flatten(), ar_rows]), logits_rows.numel()
        return self.logits_rows

    def window_starts(self, slots: np.ndarray) -> torch.Tensor:
        # The device's record: the host half of the table is not written in this layout.
        return self.table.committed_len[torch.from_numpy(slots).to(self.device, non_blocking=True)]

    def row_positions(self) -> torch.Tensor:
        # Read before the next step's prepare rewrites the positions. Next-token rows: a lossless
        # window's leading-run rows (``check_rows``) and the draws' rows after the windows'.
        positions = self.runner.positions[self.logits_rows].to(torch.int64)  # [N]
        next_token = torch.ones_like(positions, dtype=torch.bool)
        next_token[: self.window_logits] = False
        if self.window_logits and self.forwarded[-1] is not None:  # a step with lossless windows
            w_slots, run, *_, w_lossless = self.forwarded
            next_token[: self.window_logits] = check_rows(w_lossless, run, self.rows_per_window).flatten()
        return positions + next_token

    def logits_rows_per_window(self, lossless_windows: np.ndarray, window_rows: np.ndarray,
                               mask_rows: int | None = None) -> int:
        """R, the logits rows of every window of a fixed-rows step: the most undecided slots a window
        can have (the server's W, or the scheduler's bound on the slots after any window's leading
        run in the step, ``mask_rows``: the step plan's), or, in a step with a
        lossless window ([B] bool), the most rows a window can have (2W), which its verification
        reads; and no more than the most rows a window of the step forwards (``window_rows`` [Bw]).
        A window that is not void holds its run and the slots after it within its rows, so those
        bound its mask rows too. An adaptive window's W is mostly far below the server's, and each
        logits row costs the LM head's FLOPs and its share of the sampling (R 16 for windows of W 1
        cost 2 ms a step on the Qwen3-8B shape at batch 64, lab notebook 5.20); windows of W 1 need
        one row each, where their rows (run and mask) are two."""
        window_size = self.settings.window_size
        if lossless_windows.any():
            most = max_window_tokens(window_size)
        else:
            most = window_size if mask_rows is None else min(window_size, max(mask_rows, 1))
        return int(min(most, window_rows.max(initial=1)))

    def ar_input_ids(self, req_ids: list[str], slots: np.ndarray, autoregressive: np.ndarray, draws: np.ndarray,
                     starts: np.ndarray, n: np.ndarray) -> torch.Tensor:
        """The logits rows of the requests that draw a next token this step (``draws``
        [B] bool, an AR-decoded request's or a lossless request's first), the last row of each ([Bd]
        device row indices), and the input ids of AR-decoded requests ([B] bool ``autoregressive``).

        Under async scheduling vLLM keeps a request's draw on the device and its host copy of the
        tokens holds -1 there; its own scatter of the last step's draws is off with fixed rows
        (``before_input_ids``). An AR request's row that holds -1 is its last draw, kept on the
        device per slot (``ar_draws``, written by the step that drew it). vLLM sends the
        real tokens of a request that skipped a step, so -1 is only ever its last row."""
        runner = self.runner
        if not draws.any():  # the usual step: no scan of its rows, no copy
            return torch.zeros(0, dtype=torch.long, device=self.device)
        rows = starts[draws] + n[draws] - 1  # [Bd]
        stale = np.zeros(0, np.int64)
        if autoregressive.any():
            batch_row = np.repeat(np.arange(len(n)), n)  # [T] the request of each row
            stale = np.flatnonzero(autoregressive[batch_row] & (runner.input_ids.np[: len(batch_row)] < 0))  # [S]
            unknown = stale[~np.isin(stale, rows)]
            if len(unknown):
                raise RuntimeError(f"AR request {req_ids[batch_row[unknown[0]]]}: an input token is known neither "
                                   "on the host nor on the device")
            stale_slots = slots[batch_row[stale]]
        index = torch.from_numpy(np.concatenate([rows, stale, stale_slots if len(stale) else stale])).to(
            self.device, non_blocking=True)
        if len(stale):
            runner.input_ids.gpu[index[len(rows): len(rows) + len(stale)]] = (
                self.ar_draws[index[len(rows) + len(stale):]].to(runner.input_ids.gpu.dtype))
        return index[: len(rows)]

    def before_input_ids(self) -> None:
        # Async scheduling keeps the last step's draws on the device to scatter them into the next
        # input ids; a window's rows come from the table instead (``prepare``), an AR request's
        # last draw from ``ar_draws`` (``ar_input_ids``).
        self.runner.input_batch.prev_sampled_token_ids = None

    def sample(self, logits: torch.Tensor | None) -> SamplerOutput:
        """With no device-to-host copy: finish the forwarded windows
        from their R logits rows each, plan every next window (also the first one after a prompt, and
        a preempted request's after its re-prefill) into the table, and return what each window
        returns now (``fixed_rows_window_step``), padded with -1, as the step's sampled tokens (a
        device tensor); an AR-decoded request's draw is its first column."""
        step = self.step
        states, new, resumed = self.prompt_ends(step)  # [B] bool each: first window; after preemption
        # A window of W 0 re-prefilled after a preemption draws from its last row now (``first_token``)
        # and starts afresh with that draw, as a new lossless window does.
        redrawn = resumed & step.first_token
        new, resumed = new | redrawn, resumed & ~redrawn
        self.runner.wedlm_request_forwards += int(redrawn.sum())  # the W 0 window's forward, which draws
        self.redrawn += int(redrawn.sum())
        wants = np.fromiter((state.logprobs for state in states), bool, len(states))  # [B]: log-probs asked
        raw_logits, logits, grammar, verified_grammar, masked = self.edited_rows(logits, states)
        sampled = self._step_windows(raw_logits, logits, wants, masked, states)  # [Bw, width] or None
        drawn = None  # [Bd]: the draws' tokens, in batch order
        if not step.window.all() or sampled is None:  # not every request forwarded a window
            sampled, drawn = self._draw_and_start(logits, sampled, new, resumed)
        if (grammar | verified_grammar).any():
            self.follow_grammars(sampled, grammar, verified_grammar)
        logprobs = None
        if wants.any():
            logprobs = self.returned_logprobs(raw_logits, sampled, drawn, new | resumed, states)
        self.spans = self._planned_spans(sampled) if self.settings.adaptive_window else None
        planned_afresh = np.flatnonzero(step.window | new)  # [P - resumed] batch rows
        for row in planned_afresh:
            states[row].has_window = True
            states[row].window_size = int(step.window_sizes[row])
        self.trace(step.req_ids, planned_afresh, step.window_sizes)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs)

    def _step_windows(self, raw_logits: torch.Tensor | None, logits: torch.Tensor | None, wants: np.ndarray,
                      masked: np.ndarray, states: list) -> torch.Tensor | None:
        """Finish the forwarded windows from their R rows each (the window step, and the windows of
        W 0 apart) and keep their next windows in the table; what each returns now ([Bw, width]
        int32, device), or None without windows. ``wants`` [B]: requests that ask for log-probs;
        ``masked`` [B]: plain windows whose first slot a grammar masks (filled whatever its entropy)."""
        step, table, runner, rows_per_window = self.step, self.table, self.runner, self.rows_per_window
        if not step.window.any():
            return None
        window_rows = np.flatnonzero(step.window)  # [Bw]
        num_window_logits = len(window_rows) * rows_per_window  # the first logits rows; then the draws' rows
        w_slots, run, start, rows, full, w_lossless = self.forwarded
        runner.wedlm_request_forwards += len(window_rows)
        window_logits = logits[:num_window_logits]
        sampling = self.sampling_batch(np.where(step.window, rows_per_window, 0), np.zeros(len(step.req_ids), np.int64))
        tokens = None  # greedy: drawn inside the step
        plain_logprobs = wants & ~step.lossless  # [B]: plain windows whose fills' log-probs are kept
        if sampling.temperature is not None or plain_logprobs[window_rows].any():
            if w_lossless is not None:  # a lossless window's leading-run rows are AR rows: no mask ban
                ban = ~check_rows(w_lossless, run, rows_per_window).flatten()  # [Bw * R]
                sampling = dataclasses.replace(sampling, ban_mask_token=ban)
            tokens = sample(window_logits, sampling, self.mask_id)
        if plain_logprobs[window_rows].any():
            self.write_fills(raw_logits[:num_window_logits], tokens, plain_logprobs[window_rows], rows_per_window,
                             states)
        sampled = None
        zero = self.zero_windows
        if zero is None or not zero[0].all():  # windows with masks: the window step
            runner.wedlm_window_step_runs["steps"] += 1
            arguments = (table.windows, table.order, w_slots, window_logits, tokens, run, start, rows,
                         table.entropy_threshold, table.pos_penalty, self.window_sizes, self.max_model_len,
                         self.mask_id, rows_per_window, w_lossless)
            if masked.any():  # a grammar's first mask is filled whatever its entropy: not the compiled step
                fill_first = self.on_device(masked[window_rows])  # [Bw]
                *windows, order, committed_len, sampled, void = fixed_rows_window_step(*arguments, fill_first)
            else:
                *windows, order, committed_len, sampled, void = self.window_step(*arguments)
            table.keep(w_slots, WindowBatch(*windows), order, committed_len)
            if not full:  # some windows got fewer than 2W rows: count the void ones (no host sync)
                self.void_windows = self.void_windows + void.sum()
        if zero is not None:  # after the window step, whose plans of these windows they replace
            sampled = self.step_zero_windows(zero[0], window_logits, rows_per_window, sampled,
                                             max(2, rows_per_window))
        return sampled

    def _draw_and_start(self, logits: torch.Tensor | None, sampled: torch.Tensor | None, new: np.ndarray,
                        resumed: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """In a step where not every request forwarded a window: draw each next token from its row
        after the windows' (an AR-decoded request's, returned now and kept for its next input; a new
        lossless request's, its window's slot 0), then plan the windows of the ``new`` and ``resumed``
        ([B] bool) requests. Returns every request's returned tokens ([B, width], the windows'
        ``sampled`` among them) and the draws ([Bd], batch order, or None)."""
        step, rows_per_window = self.step, self.rows_per_window
        num_reqs, width = len(step.req_ids), max(2, rows_per_window)
        window_rows = np.flatnonzero(step.window)  # [Bw]
        draw_rows = np.flatnonzero(step.ar_next | step.first_token)  # [Bd]: a row each, after the windows'
        every = torch.full((num_reqs, width), -1, dtype=torch.int32, device=self.device)
        ar_rows = np.flatnonzero(step.ar_next)  # [Ba]
        index = self.on_device(np.concatenate([window_rows, ar_rows, step.slots[ar_rows]]))
        if sampled is not None:
            every[index[: len(window_rows)]] = sampled
        drawn = first_tokens = None
        if len(draw_rows):
            # Each next token from its request's last row (no mask ban), as vLLM's sampler draws it.
            draws = (step.ar_next | step.first_token).astype(np.int64)
            drawn = sample(logits[len(window_rows) * rows_per_window:], self.sampling_batch(draws, draws),
                           self.mask_id)  # [Bd]
            is_ar = step.ar_next[draw_rows]  # [Bd]
            if is_ar.all():
                ar_drawn = drawn
            else:
                ar_drawn = self.rows(drawn, is_ar)
                first_tokens = self.rows(drawn, ~is_ar)  # [new lossless], in batch order
            if len(ar_rows):
                every[index[len(window_rows): len(window_rows) + len(ar_rows)], 0] = ar_drawn.to(torch.int32)
                self.ar_draws[index[len(window_rows) + len(ar_rows):]] = ar_drawn
        self.start_after_prefill(step, new, resumed, every, first_tokens)
        return every, drawn

    def _planned_spans(self, sampled: torch.Tensor) -> tuple[list[str], torch.Tensor] | None:
        """For the scheduler (adaptive window): the spans of the plain windows the window step planned
        (``window_spans``), by request id; a window of W 0 plans its next window with its draw alone,
        W slots after it, which is the scheduler's own bound, and a lossless window's rows are 2W
        whatever its span."""
        step = self.step
        window_rows = np.flatnonzero(step.window)  # [Bw]
        stepped = ~step.lossless[window_rows]  # [Bw]
        if self.zero_windows is not None:
            stepped &= ~self.zero_windows[0]
        stepped = np.flatnonzero(stepped)
        if not len(stepped):
            return None
        return [step.req_ids[window_rows[i]] for i in stepped], self.window_spans(sampled, window_rows, stepped)

    def window_spans(self, sampled: torch.Tensor, window_rows: np.ndarray, among: np.ndarray) -> torch.Tensor:
        """[k] int32 device: how many slots follow the leading run of the window the step planned for
        each of its windows ``among`` ([k], their index among the step's windows, at batch
        ``window_rows`` [Bw]): its length in the table, less the run it returns now (``sampled``,
        [B, width] or [Bw, width], -1 after each run). The scheduler bounds it otherwise by every
        fill a wider window left (``WeDLMFixedRowsScheduler._planned``), so that a window that shrank
        forwards rows for slots no longer there until they would all have been committed: 15 steps
        after a probe of W 16 that filled nothing."""
        rows = window_rows[among] if sampled.shape[0] != len(window_rows) else among
        if len(rows) != sampled.shape[0]:
            sampled = sampled[torch.from_numpy(rows).to(self.device, non_blocking=True)]
        slots = self.forwarded[0]
        if len(among) != len(window_rows):
            slots = slots[torch.from_numpy(among).to(self.device, non_blocking=True)]
        return (self.table.windows.length[slots] - (sampled >= 0).sum(1)).to(torch.int32)

    def runner_output(self, output):
        spans, self.spans = self.spans, None
        if spans is None:
            return output
        if isinstance(output, AsyncModelRunnerOutput):  # copied behind the step, as vLLM copies its tokens
            return AsyncOutputWithSpans(output, *spans)
        if isinstance(output, ModelRunnerOutput):  # a synchronous step: already waited for
            return with_window_spans(output, *spans)
        return output

    def step_zero_windows(self, zero: np.ndarray, window_logits: torch.Tensor, rows_per_window: int,
                          sampled: torch.Tensor | None, width: int) -> torch.Tensor:
        """Finish the step's windows of W 0 (``zero`` [Bw] bool, among its windows): each draws its
        next token from its logits row, its run's last (a next-token row: the mask id is not banned,
        as in an AR step and the reference decoder's ``_ar_draw``), and plans its next window with the
        draw as its slot 0 (``window_step.zero_window_step``). Returns the step's sampled tokens
        ([Bw, width]) with theirs: ``sampled`` (the window step's, or None where every window is
        W 0) at the other windows."""
        step, table = self.step, self.table
        w_slots, run, start, *_ = self.forwarded
        among = np.flatnonzero(zero)  # [Bz] their index among the windows
        if len(among) == len(zero):  # every window of the step (the usual step at W 0): nothing to gather
            windows, logits = slice(None), window_logits[::rows_per_window]  # [Bz, V]: each one's first row
        else:
            index = torch.from_numpy(np.concatenate([among, among * rows_per_window])).to(self.device,
                                                                                         non_blocking=True)
            windows, logits_rows = index.view(2, -1)
            logits = window_logits[logits_rows]  # [Bz, V]
        draws_per_request = np.zeros(len(step.req_ids), np.int64)
        draws_per_request[np.flatnonzero(step.window)[among]] = 1
        draws = sample(logits, self.sampling_batch(draws_per_request, draws_per_request), self.mask_id)  # [Bz]
        committed_len = (start + run)[windows]  # [Bz]: the run's KV is written now
        plan, returned = zero_window_step(draws, committed_len, self.window_sizes[windows], table.capacity,
                                          self.max_model_len, self.mask_id, width)
        table.keep(w_slots[windows], plan.windows, plan.order, committed_len)
        if sampled is None:  # every window of the step is W 0, in the same order
            return returned
        sampled[windows] = returned
        return sampled

    def window_index(self, rows: np.ndarray) -> torch.Tensor:
        """[k] device: the index among the step's windows of each window at batch ``rows`` ([k])."""
        return torch.from_numpy(np.cumsum(self.step.window)[rows] - 1).to(self.device, non_blocking=True)

    def grammar_rows(self, plain: np.ndarray, verified: np.ndarray, first: np.ndarray) -> GrammarRows:
        """Where the windows under a grammar draw (``grammar_rows.py``): the first mask of each
        ``plain`` window ([B] bool) is its row ``filled - run`` of R (filled slots come first in a
        window's rows), unless the window is void or the mask lies past its R rows; a ``verified``
        (lossless) window's checks are its first rows, over its leading run read back from the
        device table (one host sync); ``first`` ([B] bool) lossless requests draw their first token."""
        table, r = self.table, self.rows_per_window
        none = GrammarRows.none(len(plain))
        first_masks, has_row, runs = none.first_masks, None, []
        if plain.any() or verified.any():
            w_slots, run, _, rows, *_ = self.forwarded
        if plain.any():
            window = self.window_index(np.flatnonzero(plain))  # [G]
            planned = table.windows.rows(w_slots[window])
            k = planned.filled.sum(1) - run[window]  # [G]: the first mask's logits row in its window
            has_row = (k < r) & (planned.length <= rows[window])  # [G]
            first_masks = window * r + torch.where(has_row, k, r - 1)
        lossless = np.flatnonzero(verified)
        if len(lossless):
            planned = table.windows.rows(w_slots[self.window_index(lossless)])
            tokens, lead = planned.tokens.cpu().numpy(), leading_filled(planned.filled).cpu().numpy()  # one sync
            runs = [tokens[j, : min(int(lead[j]), r)].tolist() for j in range(len(lossless))]  # logical order
        return GrammarRows(np.flatnonzero(plain), first_masks, has_row, lossless, runs, first)

    def follow_grammars(self, sampled: torch.Tensor, plain: np.ndarray, verified: np.ndarray) -> None:
        """The grammar stage after the draws (``grammar_rows.py``), with the run each window under a
        grammar returns (``sampled`` [B, width], device; the step waits for it here): a ``plain``
        window ([B] bool) the grammar cuts is planned anew in the table and returns the run it
        accepts; a ``verified`` (lossless) one's run is taken whole."""
        step, device = self.step, self.device
        rows = np.flatnonzero(plain | verified)  # [G]
        runs = [run[run >= 0].tolist() for run in sampled[self.on_device(rows)].cpu().numpy()]  # -1 after each run
        cuts = self.runner.wedlm_grammars.follow(step.req_ids, rows, runs, verified[rows])
        if not cuts:
            return
        cut_rows = rows[[k for k, _ in cuts]]
        window = self.window_index(cut_rows)  # [K]
        slots, at = self.forwarded[0][window], torch.tensor([kept for _, kept in cuts], device=device)  # [K] each
        self.table.reopen(slots, at, self.window_sizes[window], self.table.committed_len[slots], self.max_model_len)
        cut = self.on_device(cut_rows)
        columns = torch.arange(sampled.shape[1], device=device)[None]  # [1, width]
        sampled[cut] = torch.where(columns < at[:, None], sampled[cut], -1)

    def write_fills(self, raw_logits: torch.Tensor, tokens: torch.Tensor, plain_logprobs: np.ndarray,
                    rows_per_window: int, states: list) -> None:
        """Before the window step: where each row of the forwarded windows ([Bw * R] raw logits rows,
        drawing ``tokens``) may fill a slot of a plain window that asks (``plain_logprobs`` [Bw]
        bool), for the log-prob stage's rings (``token_logprobs.py``); the window step maps rows to
        slots the same way. A row that is no mask of a window that fills (a void window's, a filled
        slot's, one past the window's end) fills nothing, with no host sync."""
        capacity = self.table.capacity
        w_slots, run, start, rows, _, _ = self.forwarded
        planned, order = self.table.windows.rows(w_slots), self.table.order[w_slots]  # [Bw, C], before the step
        physical = run[:, None] + torch.arange(rows_per_window, device=self.device)[None]  # [Bw, R]
        slot = order.gather(1, physical.clamp(max=capacity - 1))  # [Bw, R] the window slot of each row
        writes = (self.on_device(plain_logprobs)[:, None] & (physical < planned.length[:, None])
                  & (planned.length <= rows)[:, None] & ~planned.filled.gather(1, slot))  # [Bw, R]
        positions = torch.where(writes, start[:, None] + slot, -1)
        self.token_logprobs.fill_rings(raw_logits, tokens, None, w_slots[:, None].expand_as(slot).flatten(),
                                       positions.flatten(), states,
                                       np.repeat(np.flatnonzero(self.step.window), rows_per_window))

    def returned_logprobs(self, raw_logits: torch.Tensor | None, sampled: torch.Tensor, drawn: torch.Tensor | None,
                          planned: np.ndarray, states: list) -> LogprobsTensors:
        """Where the step's returned tokens were drawn, for the log-prob stage (``token_logprobs.py``):
        a lossless window's checks are its R rows from its first; the draws' rows (``drawn``, their
        tokens in batch order) follow the windows'; a plain window's run (one forwarded now, or
        planned after a prompt: ``planned`` [B]) reads its ring at its next window's start."""
        step = self.step
        plain = np.flatnonzero(~step.lossless & (step.window | planned))  # [Bp]
        return self.token_logprobs.returned(raw_logits, sampled, self.step_index(), drawn, plain,
                                            self.table.committed_len[self.on_device(step.slots[plain])], states)

    def step_index(self) -> StepIndex:
        """R logits rows per window first, a lossless window's checks from its first; then one row
        per request that draws, in batch order."""
        step, rows_per_window = self.step, self.rows_per_window
        window_rows = np.flatnonzero(step.window)  # [Bw]
        lossless = np.flatnonzero(step.window & step.lossless)  # [Bl]
        draws = np.flatnonzero(step.ar_next | step.first_token)  # [Bd]
        return StepIndex(step.slots, lossless, np.searchsorted(window_rows, lossless) * rows_per_window, draws,
                         len(window_rows) * rows_per_window + np.arange(len(draws)), step.first_token,
                         np.concatenate([np.repeat(window_rows, rows_per_window), draws]))

    def start_after_prefill(self, step: StepRows, new: np.ndarray, resumed: np.ndarray, sampled: torch.Tensor,
                            first_tokens: torch.Tensor | None) -> None:
        """Plan the windows of the ``new`` ([B] bool) requests, whose prompt ended
        this step, and of the ``resumed`` plain ones, re-prefilled after a preemption, into the table,
        and write each plain one's leading run into its row of ``sampled`` ([B, width]).

        A new window that drew from its last row (``step.first_token``: a lossless one after its
        prompt; a plain one of W 0 re-prefilled after a preemption, here among the ``new``) starts
        with its slot 0 filled by ``first_tokens`` ([those], batch order). A lossless one returns
        nothing before that slot's KV is written; a plain one returns it now, its leading run. A
        resumed lossless window is kept as it was: it had returned only tokens whose KV was written,
        which the re-prefill wrote again, so it starts where it did."""
        table, mask_id = self.table, self.mask_id
        resumed = resumed & ~step.lossless
        num_new, num_resumed = int(new.sum()), int(resumed.sum())
        if not num_new + num_resumed:
            return
        new_lossless = step.lossless[new]  # [num_new]
        new_drawn = step.first_token[new]  # [num_new]
        host = torch.from_numpy(np.concatenate([step.slots[new], step.slots[resumed], step.committed_len[new],
                                                np.flatnonzero(new), np.flatnonzero(resumed),
                                                np.flatnonzero(new_drawn), step.window_sizes[new]]))
        new_slots, resumed_slots, new_starts, rows, drawn_index, new_sizes = host.to(
            self.device, non_blocking=True).split([num_new, num_resumed, num_new, num_new + num_resumed,
                                                   int(new_drawn.sum()), num_new])
        parts, starts, sizes = [], [], []
        if num_new:
            fresh = WindowBatch.empty(num_new, table.capacity, mask_id, self.device)
            if new_drawn.any():
                fresh.tokens[drawn_index, 0] = first_tokens
                fresh.filled[drawn_index, 0] = True
            parts.append(fresh)
            starts.append(new_starts)  # after the prompt
            sizes.append(new_sizes)
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

