"""Exact window rows (``row_layout.py``): each window forwards its own slots, laid out on the host.

The scheduler (``scheduler.py``) sends a window as its leading filled run (tokens already returned
to vLLM as output, not yet forwarded) followed by its draft tokens, the rest of the window in the
physical order planned here; vLLM writes the input ids. A step copies its results to the host
once, and the scheduler reads each next window from the runner's output (``WeDLMRunnerOutput``).
A step's sampled tokens are each next window's leading filled run: every slot before them is
decided, so they are returned as soon as they are known, one forward before the forward that
writes their KV (the same lag as an AR token, streamed the step it is drawn). A prefill without a
window samples none and, once complete, plans the request's first window (where it could not ride
with the prompt) or the one it had when it was preempted. Lossless windows return their run once
verified, when their KV is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors, ModelRunnerOutput, SamplerOutput

from vllm_wedlm.adapter.custom_processors import RowContext
from vllm_wedlm.adapter.grammar_rows import GrammarRows
from vllm_wedlm.adapter.protocol import wedlm_output
from vllm_wedlm.adapter.row_layout import RowLayout, ragged_arange
from vllm_wedlm.adapter.step_index import StepIndex
from vllm_wedlm.adapter.step_rows import StepRows
from vllm_wedlm.adapter.window_step import plan_rows
from vllm_wedlm.adapter.window_table import packet_width
from vllm_wedlm.core.batch import (
    WindowBatch,
    drop_leading,
    finish_windows,
    leading_filled,
    plan_windows,
    verification_drafts,
    verify_windows,
)
from vllm_wedlm.core.sampling import accept_drafts, sample
from vllm_wedlm.core.selection import row_entropy

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

# What a logits row of a step is for.
MASK_ROW = 0  # a window's mask row: entropy and a draw for the fill
CHECK_ROW = 1  # a lossless window's leading-run row: checks the next fill (core.sampling.verify)
AR_NEXT_ROW = 2  # an AR-decoded request's next token (its last row)
FIRST_TOKEN_ROW = 3  # a lossless request's first token (the prompt's last row): its window's slot 0


def first_logits_rows(step: StepRows) -> np.ndarray:
    """[B] int64: each request's first logits row (a step's rows are grouped by request)."""
    return np.cumsum(step.num_logits) - step.num_logits


class ExactRows(RowLayout):
    """Exact window rows under vLLM's synchronous scheduling (``row_layout.py``)."""

    vllm_ar_steps = True  # what it keeps between steps is each window's, and such a step has none

    def __init__(self, runner, window_step):
        super().__init__(runner, window_step)
        # What the last step planned, for the scheduler: each request's next window (its input ids,
        # physical order) and each window's leading run returned before its forward.
        self.next_windows: dict[str, list[int]] = {}
        self.unforwarded: dict[str, int] = {}

    def prepare(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: np.ndarray) -> tuple:
        """Plan the first windows that came with a prompt; rewrite the RoPE positions of window rows
        to their logical ones (vLLM computed KV slots from the physical ones); ask for the logits of
        mask rows, and of a lossless window's leading run (its first rows)."""
        runner = self.runner
        batch = self.scheduled(scheduler_output, num_scheduled_tokens)
        req_ids, states, slots, autoregressive = batch.req_ids, batch.states, batch.slots, batch.autoregressive
        scheduled_drafts, n, starts, computed = batch.window, batch.n, batch.starts, batch.computed
        num_reqs = len(req_ids)
        host = self.table.host

        window = scheduled_drafts & ~autoregressive
        ar_drafts = scheduled_drafts & autoregressive
        if ar_drafts.any():
            row = int(np.argmax(ar_drafts))
            raise RuntimeError(f"AR request {req_ids[row]} on a WeDLM engine got draft tokens")
        uncomputed = runner.input_batch.num_tokens_no_spec[:num_reqs] - computed  # [B]: prompt or leading run
        # A first window, scheduled with the prompt's last rows (adapter/scheduler.py): planned now.
        first = window & ~np.fromiter((s.has_window for s in states), bool, num_reqs)  # [B]
        if first.any():
            self.start_windows(req_ids, states, first, computed + uncomputed, batch.window_sizes)
        prompt_rows = np.where(first, uncomputed, 0)  # [B] rows before each window: a first window's prompt
        wrong = window & (n != prompt_rows + host.length[slots])
        if wrong.any():
            row = int(np.argmax(wrong))
            raise RuntimeError(
                f"WeDLM request {req_ids[row]}: {n[row] - prompt_rows[row]} tokens scheduled for a window of "
                f"{host.length[slots[row]]}; the token budget must fit every running window "
                "(max_num_batched_tokens >= max_num_seqs * 2 * window_size)")
        completes_prefill = ~scheduled_drafts & (computed + n >= runner.input_batch.num_tokens_no_spec[:num_reqs])
        # An AR request draws its next token whenever it forwarded all its tokens (its prompt's
        # last row first, then each last drawn token's), as vLLM's sampler would; so does a WeDLM
        # request stepping AR (W 0: its leading run forwarded, its window dropped).
        stepping_ar = completes_prefill & ~autoregressive & (batch.window_sizes == 0)
        ar_next = completes_prefill & autoregressive | stepping_ar
        # A lossless request draws its first token from the prompt's last row too; after a
        # preemption it already holds it in its window.
        lossless = np.fromiter((s.params.lossless for s in states), bool, num_reqs) & ~autoregressive  # [B]
        # (One stepping AR draws its next token as the AR step's, whether it held a window or not.)
        first_token = completes_prefill & lossless & ~stepping_ar
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
        intra = ragged_arange(n)  # [T]
        positions = np.repeat(computed, n) + intra  # [T]
        row_in_window = intra - np.repeat(prompt_rows, n)  # [T]
        in_window = np.repeat(window, n) & (row_in_window >= 0)  # [T]
        positions[in_window] = (np.repeat(computed + prompt_rows, n)[in_window]
                                + host.order[np.repeat(slots, n)[in_window], row_in_window[in_window]])
        total = len(positions)
        runner.positions[:total].copy_(torch.from_numpy(positions), non_blocking=True)  # in place: graphs read it

        self.step = StepRows(list(req_ids), slots, autoregressive, window, completes_prefill, lossless,
                                    ar_next, first_token, computed + n, num_logits, num_checks, batch.window_sizes)
        k = ragged_arange(num_logits)  # [N] row index inside each request's logits
        first_rows = np.repeat(starts, num_logits) + k
        last_rows = np.repeat(starts + n - num_logits, num_logits) + k
        indices = np.where(k < np.repeat(num_checks, num_logits), first_rows, last_rows)
        self.step_positions, self.logits_indices = positions, indices  # [T], [N]: for row_positions, when asked
        return torch.from_numpy(indices).to(self.device, non_blocking=True), None

    def window_starts(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.table.host.committed_len[slots]).to(self.device, non_blocking=True)

    def row_positions(self) -> torch.Tensor:
        return torch.from_numpy(self.host_row_positions()).to(self.device, non_blocking=True)

    def host_row_positions(self) -> np.ndarray:
        """[N] int64: ``row_positions``, on the host."""
        step = self.step
        next_token = ragged_arange(step.num_logits) < np.repeat(step.num_ar_rows, step.num_logits)  # [N]
        return self.step_positions[self.logits_indices] + next_token

    def row_contexts(self, row_requests: np.ndarray) -> list[RowContext]:
        # The host's windows are still the ones forwarded now. A row's context is its request's
        # output list (which holds a plain window's leading run, returned before its forward), then
        # the window's slots up to the row in logical order: fills, and the mask id where undecided.
        step, host = self.step, self.table.host
        positions = self.host_row_positions().tolist()  # [N]
        output_start = self.prompt_lengths()  # [B]: the position of each request's first output token
        lists = self.runner.input_batch.req_output_token_ids
        windows: dict[int, np.ndarray] = {}  # batch row -> its window's tokens in logical order
        contexts = []
        for row, request in enumerate(row_requests.tolist()):
            length = positions[row] - int(output_start[request])  # output tokens before the row
            keep = min(len(lists[request]), length)
            extra: list[int] = []
            if keep < length:
                slot = step.slots[request]
                begin = int(output_start[request]) + keep - int(host.committed_len[slot])  # in the window
                if not step.window[request] or begin < 0 or length - keep > host.length[slot] - begin:
                    raise RuntimeError(f"WeDLM request {step.req_ids[request]}: a logits row at position "
                                       f"{positions[row]} is not covered by its output and window")
                if request not in windows:
                    logical = np.full(host.length[slot], self.mask_id, np.int64)
                    logical[host.order[slot, : host.length[slot]]] = host.input_ids[slot, : host.length[slot]]
                    windows[request] = logical
                extra = windows[request][begin: begin + length - keep].tolist()
            contexts.append((keep, extra))
        return contexts

    def sample(self, logits: torch.Tensor | None) -> SamplerOutput:
        """Run ``core`` on the step's logits rows (entropy, selection, sampling, commit, refill), plan
        every next window, and copy what the host needs in one device-to-host copy."""
        step, table = self.step, self.table
        host = table.host
        states, new, resumed = self.prompt_ends(step)  # [B] bool each: first window; after preemption
        if not (step.window.any() or new.any() or resumed.any() or step.first_token.any()):
            return self.sample_draws(logits, states)
        raw_logits, logits, grammar, verified_grammar, masked = self.edited_rows(logits, states)

        # The windows forwarded now: this forward wrote the KV of each one's leading run (a
        # lossless window's first run of accepted fills, known below), which the next plan drops.
        w_slots = step.slots[step.window]
        lossless_runs = host.input_ids[w_slots[step.lossless[step.window]]]  # [Bl, C]: before the table moves on
        self.runner.wedlm_request_forwards += len(w_slots)

        # A plain window's leading run went back to vLLM as output before its forward, so the
        # re-prefill covered it: such a window resumes one run later, with the same other slots.
        moved = resumed & ~step.lossless
        expected_len = host.committed_len[step.slots] + np.where(moved, host.num_commit[step.slots], 0)
        for row in np.flatnonzero(resumed & (expected_len != step.committed_len)):
            raise RuntimeError(f"WeDLM request {step.req_ids[row]}: re-prefilled {step.committed_len[row]} "
                               f"tokens, but its window starts after {expected_len[row]}")
        self.trace(step.req_ids, np.flatnonzero(step.window | new), step.window_sizes)
        num_rows = int(step.num_logits.sum())
        verified_commit = step.num_checks[step.window].any()  # a lossless window's run is verified on the device
        # Every row is a plain window's mask row: the step's fixed device work (compiled on a GPU).
        plain = bool((len(w_slots) or new.any() or moved.any()) and num_rows and step.window.all()
                     and not verified_commit and not masked.any())
        row_kind = None if plain else self.row_kinds(step)
        wants_logprobs = any(state.logprobs for state in states)  # then every row's draw is needed here
        tokens = None  # [N]; in a plain step of greedy rows the window step draws them itself
        if num_rows:
            sampling = self.sampling_batch(step.num_logits, step.num_ar_rows)
            if not (plain and sampling.temperature is None and sampling.ban_mask_token is None and not wants_logprobs):
                tokens = sample(logits, sampling, self.mask_id)
        commit, ar_tokens, plan_slots, sizes = self._plan_next_windows(logits, tokens, row_kind, new, moved, masked,
                                                                        plain, verified_commit)
        if (grammar | verified_grammar).any():
            self.follow_grammars(grammar, verified_grammar, plan_slots, sizes, lossless_runs, commit)
        sampled, early, run_len = self._returned_tokens(states, new, resumed, commit, lossless_runs, ar_tokens)
        logprobs = None
        if wants_logprobs:
            logprobs = self.returned_logprobs(raw_logits, tokens, row_kind, states, sampled, early, run_len)
        # On the host: vLLM's bookkeeping reads it there (no device round trip).
        return SamplerOutput(sampled_token_ids=torch.from_numpy(sampled), logprobs_tensors=logprobs)

    def grammar_rows(self, plain: np.ndarray, verified: np.ndarray, first: np.ndarray) -> GrammarRows:
        """A window's masks follow its checks; a lossless one's checks are its leading run, on the host."""
        step, host = self.step, self.table.host
        plain = np.flatnonzero(plain & (step.num_logits > step.num_checks))  # [G], with a mask row
        lossless = np.flatnonzero(verified)
        return GrammarRows(plain, first_logits_rows(step)[plain] + step.num_checks[plain], None, lossless,
                           [host.input_ids[step.slots[b], : step.num_checks[b]].tolist() for b in lossless], first)

    def _plan_next_windows(self, logits: torch.Tensor | None, tokens: torch.Tensor | None, row_kind: np.ndarray | None,
                           new: np.ndarray, moved: np.ndarray, masked: np.ndarray, plain: bool,
                           verified_commit: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Finish the windows forwarded now and plan every next window into the table: theirs, the
        first windows of the ``new`` requests ([B] bool) and the ``moved`` ones (re-prefilled after a
        preemption), on the device, then the step's one device-to-host copy. Returns each forwarded
        window's committed run ([Bw]), the AR draws ([Ba]), and the slots and W of the windows planned."""
        step, table = self.step, self.table
        host = table.host
        w_slots = step.slots[step.window]
        w_checks = step.num_checks[step.window]  # [Bw], > 0 for lossless windows
        lead = host.num_commit[w_slots]  # [Bw]
        start_len = host.committed_len[w_slots]  # [Bw]
        plan_slots = np.concatenate([w_slots, step.slots[new], step.slots[moved]])  # [P]
        num_planned = len(w_slots) + int(new.sum())  # windows planned afresh (not moved)
        # W of each window planned now; a moved one keeps its own slots (as before the preemption).
        sizes = np.concatenate([step.window_sizes[step.window], step.window_sizes[new],
                                host.length[step.slots[moved]] - host.num_commit[step.slots[moved]]])  # [P]
        device_out = []
        if len(plan_slots):
            # Tokens before each next window: a window's start moves by its committed run, which the
            # host knows (its leading run) unless the window is lossless (verified on the device).
            starts = np.concatenate([start_len if verified_commit else start_len + lead, step.committed_len[new],
                                     step.committed_len[moved]])  # [P]
            slots_dev, committed_len, sizes_dev = plan_rows(plan_slots, starts, self.device, sizes)  # [P] each
        if plain:
            self.runner.wedlm_window_step_runs["steps"] += 1
            *following, packet = self.window_step(
                table.windows, slots_dev, logits, tokens, table.entropy_threshold, table.pos_penalty, committed_len,
                sizes_dev, self.max_model_len, self.mask_id)
            table.windows.store(slots_dev, WindowBatch(*following))
            device_out.append(packet.flatten())
        elif len(plan_slots):
            parts = []
            if len(w_slots):
                ws = slots_dev[: len(w_slots)]
                planned = table.windows.rows(ws)
                verified, commit = None, leading_filled(planned.filled)
                if verified_commit:
                    verified, commit = self.verify(planned, tokens, row_kind, w_slots, w_checks,
                                                   sizes_dev[: len(w_slots)])
                    device_out.append(commit)
                mask_rows = row_kind == MASK_ROW
                mask_logits = self.rows(logits, mask_rows)
                fill_first = (torch.from_numpy(masked[step.window]).to(self.device, non_blocking=True)
                              if masked.any() else None)  # [Bw]: the first mask of a grammar's window
                parts.append(finish_windows(planned, commit, row_entropy(mask_logits), self.rows(tokens, mask_rows),
                                            table.entropy_threshold[ws], table.pos_penalty[ws], self.mask_id,
                                            verified, fill_first))
            if new.any():
                fresh = WindowBatch.empty(int(new.sum()), table.capacity, self.mask_id, self.device)
                lossless_new = step.lossless[new]
                if lossless_new.any():
                    # A lossless window starts with the token drawn from the prompt's last row.
                    first = self.rows(tokens, row_kind == FIRST_TOKEN_ROW)
                    index = torch.from_numpy(np.flatnonzero(lossless_new)).to(self.device, non_blocking=True)
                    fresh.tokens[index, 0] = first
                    fresh.filled[index, 0] = True
                parts.append(fresh)
            if moved.any():
                ms = slots_dev[num_planned:]
                run = torch.from_numpy(host.num_commit[step.slots[moved]]).to(self.device, non_blocking=True)
                parts.append(drop_leading(table.windows.rows(ms), run, self.mask_id))
            if verified_commit:
                committed_len = torch.cat([committed_len[: len(w_slots)] + commit, committed_len[len(w_slots):]])
            plan = plan_windows(WindowBatch.cat(parts), sizes_dev, committed_len, self.max_model_len)
            device_out.append(table.store(slots_dev, plan).flatten())
        if step.ar_next.any():
            device_out.append(self.rows(tokens, row_kind == AR_NEXT_ROW))
        # The step's one device-to-host copy.
        received = torch.cat(device_out).cpu().numpy() if device_out else np.zeros(0, np.int64)
        commit = lead
        if verified_commit:
            commit, received = received[: len(w_slots)], received[len(w_slots):]
        packet_size = len(plan_slots) * packet_width(table.capacity)
        if len(plan_slots):
            table.receive(plan_slots, received[:packet_size].reshape(len(plan_slots), -1),
                          np.concatenate([start_len + commit, step.committed_len[new], step.committed_len[moved]]))
        return commit, received[packet_size:], plan_slots, sizes

    def _returned_tokens(self, states: list, new: np.ndarray, resumed: np.ndarray, commit: np.ndarray,
                         lossless_runs: np.ndarray, ar_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The step's sampled tokens ([B, width], -1 after each request's): a plain window's next
        leading run (decided now, forwarded next step), a lossless window's verified run (forwarded
        now: ``commit``, of ``lossless_runs``), an AR request's draw (``ar_tokens``); and for the
        scheduler each next window and each run not forwarded yet. Returns (sampled, [B] bool: plain
        windows that return a run from their next plan, [B] that run's length)."""
        step, host = self.step, self.table.host
        num_reqs = len(step.req_ids)
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
        self.next_windows = next_windows
        self.unforwarded = {step.req_ids[row]: int(run_len[row])
                            for row in np.flatnonzero(step.window & (run_len > 0))}
        return sampled, early, run_len

    def sample_draws(self, logits: torch.Tensor | None, states: list) -> SamplerOutput:
        """``sample`` of a step without windows: each AR-decoded request that forwarded all its tokens
        draws its next token from its one logits row (``step.ar_next``; the rows are theirs, in batch
        order), as vLLM's sampler would; prefill chunks return nothing. The same draws, edits and
        log-probs as the general path, without its window bookkeeping: what a batch of requests
        decoded AR on this engine pays per step (issue 41: the host work of such a step is most of
        its time on a small model)."""
        step = self.step
        draws = step.ar_next  # [B]
        rows = np.flatnonzero(draws)  # [Ba] batch rows, one logits row each
        tokens = None  # [Ba]
        # The rows' grammars (vLLM's masks: no window here), edits and thinking budgets, as the general path.
        raw_logits, logits, *_ = self.edited_rows(logits, states)
        if len(rows):
            counts = draws.astype(np.int64)
            tokens = sample(logits, self.sampling_batch(counts, counts), self.mask_id)
        sampled = np.full((len(step.req_ids), 2), -1, dtype=np.int32)  # width 2 keeps -1 padding
        if tokens is not None:
            sampled[draws, 0] = tokens.cpu().numpy()
        self.next_windows, self.unforwarded = {}, {}
        logprobs = None
        if any(state.logprobs for state in states):  # as the general path: also in a step of prefill chunks alone
            logprobs = self.token_logprobs.returned(raw_logits, self.on_device(sampled), self.step_index(), tokens,
                                                    rows[:0], self.on_device(rows[:0]), states)
        return SamplerOutput(sampled_token_ids=torch.from_numpy(sampled), logprobs_tensors=logprobs)

    def returned_logprobs(self, raw_logits: torch.Tensor | None, tokens: torch.Tensor | None,
                          row_kind: np.ndarray | None, states: list, sampled: np.ndarray, early: np.ndarray,
                          run_len: np.ndarray) -> LogprobsTensors:
        """Where the step's returned tokens were drawn, for the log-prob stage (``token_logprobs.py``):
        a lossless window's checks are its first logits rows; an AR draw or a new lossless request's
        first token is its request's one row; a plain window's run (``early`` [B] bool, ``run_len``
        [B] tokens, returned from its next plan) reads its ring, which this step's mask rows write
        first, at their own positions."""
        step = self.step
        num_rows = 0 if tokens is None else len(tokens)
        if row_kind is None:  # a plain step: every row is a mask row
            row_kind = np.full(num_rows, MASK_ROW, np.int8)
        request = np.repeat(np.arange(len(states)), step.num_logits)  # [N]
        asks = np.fromiter((state.logprobs for state in states), bool, len(states)) & early  # [B]
        mask_rows = np.flatnonzero((row_kind == MASK_ROW) & asks[request])  # [m]
        if len(mask_rows):
            index = torch.from_numpy(mask_rows).to(self.device, non_blocking=True)
            positions = self.step_positions[self.logits_indices][mask_rows]  # [m] the slot each row may fill
            self.token_logprobs.fill_rings(raw_logits, tokens[index], index,
                                           self.on_device(step.slots[request[mask_rows]]), self.on_device(positions),
                                           states, request[mask_rows])
        plain = np.flatnonzero(early & (run_len > 0))  # [Bp]
        index = self.step_index()
        draw_tokens = tokens[self.on_device(index.draw_rows)] if len(index.draws) else None
        return self.token_logprobs.returned(raw_logits, self.on_device(sampled), index, draw_tokens, plain,
                                            self.on_device(self.table.host.committed_len[step.slots[plain]]), states)

    def step_index(self) -> StepIndex:
        """Each request's logits rows are together, a lossless window's checks first; a request that
        draws has one row."""
        step = self.step
        first_row = first_logits_rows(step)  # [B]
        lossless = np.flatnonzero(step.window & step.lossless)  # [Bl]
        draws = np.flatnonzero(step.ar_next | step.first_token)  # [Bd]
        return StepIndex(step.slots, lossless, first_row[lossless], draws, first_row[draws], step.first_token,
                         np.repeat(np.arange(len(step.req_ids)), step.num_logits))

    def follow_grammars(self, plain: np.ndarray, verified: np.ndarray, plan_slots: np.ndarray, sizes: np.ndarray,
                        lossless_runs: np.ndarray, commit: np.ndarray) -> None:
        """The grammar stage after the draws (``grammar_rows.py``), with the runs the windows under a
        grammar return: a ``plain`` one's ([B] bool) is its next window's leading run, a lossless
        one's (``verified`` [B] bool) its verified run (``lossless_runs`` [Bl, C], ``commit`` [Bw]).
        A plain window the grammar cuts is planned anew (its slot and W among the step's plan,
        ``plan_slots`` / ``sizes`` [P]), so the run the step returns is what the grammar accepts."""
        step, host = self.step, self.table.host
        rows = np.flatnonzero(plain | verified)  # [G]
        verified_rows = np.flatnonzero(step.window & step.lossless)  # [Bl]
        lossless_commit = commit[step.lossless[step.window]]  # [Bl]
        runs = []
        for row in rows:
            slot = step.slots[row]
            if verified[row]:
                k = np.searchsorted(verified_rows, row)
                runs.append(lossless_runs[k, : lossless_commit[k]].tolist())
            else:  # the leading run, logical order
                runs.append(host.input_ids[slot, : host.num_commit[slot]].tolist())
        cuts = self.runner.wedlm_grammars.follow(step.req_ids, rows, runs, verified[rows])
        if not cuts:
            return
        slots = step.slots[rows[[k for k, _ in cuts]]]
        cut_sizes = np.array([sizes[np.flatnonzero(plan_slots == slot)[0]] for slot in slots])
        index, at, window_size = plan_rows(slots, np.array([kept for _, kept in cuts], np.int64), self.device,
                                           cut_sizes)
        self.table.reopen(index, at, window_size, self.on_device(host.committed_len[slots]), self.max_model_len,
                          slots)

    def row_kinds(self, step: StepRows) -> np.ndarray:
        """[N] int8: what each logits row of the step is for (``MASK_ROW`` ...), request by request."""
        k = ragged_arange(step.num_logits)  # [N]
        checking = k < np.repeat(step.num_checks, step.num_logits)
        kind = np.where(checking, CHECK_ROW, MASK_ROW).astype(np.int8)
        kind[np.repeat(step.ar_next, step.num_logits)] = AR_NEXT_ROW
        kind[np.repeat(step.first_token, step.num_logits)] = FIRST_TOKEN_ROW
        return kind

    def verify(self, planned: WindowBatch, tokens: torch.Tensor, row_kind: np.ndarray, w_slots: np.ndarray,
                w_checks: np.ndarray, window_size: torch.Tensor) -> tuple[WindowBatch, torch.Tensor]:
        """Check the lossless windows' fills against their AR rows' draws (``core.sampling.verify``,
        ``core.batch.verify_windows``); the windows to fill on and the committed run of every window
        of the step ([Bw], device). ``window_size``: the W of the windows' next plan."""
        check_tokens = self.rows(tokens, row_kind == CHECK_ROW)  # [R]: the AR rows' own draws
        drafts = verification_drafts(torch.from_numpy(self.table.host.input_ids[w_slots]),
                                     torch.from_numpy(w_checks))  # [R], on the host: no device sync
        accepted = accept_drafts(check_tokens, drafts.to(self.device, non_blocking=True))
        return verify_windows(planned, torch.from_numpy(w_checks).to(self.device, non_blocking=True), accepted,
                              check_tokens, window_size, self.mask_id)

    def vllm_sampled(self) -> None:
        self.next_windows, self.unforwarded = {}, {}

    def runner_output(self, output: ModelRunnerOutput) -> ModelRunnerOutput:
        """vLLM's output with each request's next window, which the scheduler sends as drafts."""
        if not isinstance(output, ModelRunnerOutput):
            return output
        return wedlm_output(output, next_windows=self.next_windows, unforwarded=self.unforwarded)
