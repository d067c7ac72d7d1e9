"""The device work of a step of plain windows, as functions that torch.compile can fuse.

A step whose logits rows are all mask rows of plain windows (no prefill ending, no lossless or AR
request) does the same thing every time: the draw and entropy of each mask row, fills, commit,
refill and the next physical order (``core.batch``), then what the host needs back. Run eagerly
that is about 110 small kernels, each paying the host's launch overhead (about 1 ms per step on the
H100's host at any batch size, lab notebook 5.4), and the logits are read several times over in
float32 (a float copy, the draw, the entropy's log-softmax, exp and products: about 1 ms per step
of GPU time at 256 mask rows of a 151,936-token vocabulary, lab notebook 5.10). Compiled, it is a few
kernels that read the logits a few times. Two forms:

* ``plain_window_step``: the synchronous runner's (each window's mask rows, its packet copied back),
  which the GPU worker compiles when vLLM compiles the model (not with ``--enforce-eager``);
* ``fixed_rows_window_step``: the fixed window rows' of async scheduling (W logits rows per window,
  nothing copied back: the next windows' leading runs stay on the device), compiled likewise
  (``compiled_window_step(fixed_rows=True)``).

With every row greedy the draw is made inside (``tokens`` None): compiled, it reads the bfloat16
logits once, with no float copy (lab notebook 5.10). Both only compose ``core``'s functions, which the
reference decoder runs eagerly; the CPU runs them eagerly too.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.fx.experimental._config
from vllm.logger import init_logger

from vllm_wedlm.adapter.window_table import WindowTable, window_packet
from vllm_wedlm.core.batch import (
    BatchPlan,
    WindowBatch,
    dense_drafts,
    drop_leading,
    fill_masks,
    finish_windows,
    leading_filled,
    plan_after_draw,
    plan_windows,
    slots_of_rows,
    verify_dense,
)
from vllm_wedlm.core.sampling import SamplingBatch, accept_drafts, sample
from vllm_wedlm.core.selection import row_entropy

logger = init_logger("vllm.wedlm")


def plain_window_step(table: WindowBatch, slots: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor | None,
                      entropy_threshold: torch.Tensor, pos_penalty: torch.Tensor, committed_len: torch.Tensor,
                      window_size: torch.Tensor | int, limit: int, mask_id: int) -> tuple[torch.Tensor, ...]:
    """Finish the windows at ``slots`` ([B] int64) of ``table`` ([S, C], the planned windows) and
    plan their next forward; the next windows' tokens, filled and length, and their packet ([B, ...]).

    ``logits`` [N, V] / ``tokens`` [N] int64: the mask rows of the B windows, window by window, and
    each one's draw (None: every row greedy, drawn here); ``entropy_threshold`` / ``pos_penalty`` [S]
    per slot; ``committed_len`` [B]: tokens before each next window; ``window_size``: W of each next
    window ([B], or one int). Returns plain tensors (a compiled function's outputs)."""
    tokens = _greedy(logits, mask_id) if tokens is None else tokens
    planned = table.rows(slots)
    following = finish_windows(planned, leading_filled(planned.filled), row_entropy(logits), tokens,
                               entropy_threshold[slots], pos_penalty[slots], mask_id)
    plan = plan_windows(following, window_size, committed_len, limit)
    return plan.windows.tokens, plan.windows.filled, plan.windows.length, window_packet(plan)


def fixed_rows_window_step(table: WindowBatch, table_order: torch.Tensor, slots: torch.Tensor, logits: torch.Tensor,
                           tokens: torch.Tensor | None, run: torch.Tensor, start: torch.Tensor, rows: torch.Tensor,
                           entropy_threshold: torch.Tensor, pos_penalty: torch.Tensor, window_size: torch.Tensor | int,
                           limit: int,
                           mask_id: int, rows_per_window: int | None = None,
                           lossless: torch.Tensor | None = None,
                           fill_first: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """``plain_window_step`` for fixed window rows: finish the windows at ``slots`` ([B] int64) of
    ``table`` ([S, C]) from R = ``rows_per_window`` logits rows each (default W) and plan their next
    forward with W = ``window_size`` ([B], or one int) slots after each leading run.

    ``table_order`` [S, C]: each planned window's physical order; ``logits`` [B * R, V] / ``tokens``
    [B * R] (or None: greedy, drawn here): R rows of each window in physical order, those after its
    leading run ``run`` [B] for a plain window (its masks are among them), its first R for a
    ``lossless`` one ([B] bool, or None: none is), whose leading run's rows verify its fills
    (``core.batch.verify_dense``; R must then cover the window, 2W); ``fill_first`` ([B] bool, or
    None): windows whose first mask is filled whatever its entropy (a structured output's, drawn
    under its grammar); ``start`` [B]: tokens before each window; ``rows`` [B]: the rows each window
    forwarded. A window longer than its rows (the
    scheduler predicted a shorter run) is void: a plain one writes its run's KV (run <= W <= rows),
    fills nothing and goes on with its slots after the run, so its next forward is the one the
    reference decoder runs after this run; a lossless one commits nothing and stays as it is.

    Returns the next windows' tokens, filled, length and order, the tokens before them ([B]), the
    tokens each window returns now, padded with -1 ([B, max(2, R)] int32, the step's sampled
    tokens: a plain window's next leading run, decided now and forwarded next step; a lossless
    window's verified run, whose KV this step wrote) and which windows were void ([B] bool)."""
    r = int(window_size) if rows_per_window is None else rows_per_window
    planned, order = table.rows(slots), table_order[slots]  # [B, C] each
    batch, capacity = slots.shape[0], planned.capacity
    first_row = run if lossless is None else torch.where(lossless, 0, run)  # [B]: physical row of logits row 0
    if tokens is None:  # greedy; a lossless window's leading-run rows are AR rows, which may draw the mask id
        ban = None if lossless is None else ~check_rows(lossless, run, r).flatten()
        tokens = sample(logits, SamplingBatch(None, None, None, ban), mask_id)
    row_tokens = tokens.view(batch, r)  # [B, R]
    entropy = slots_of_rows(row_entropy(logits).view(batch, r), order, first_row)  # [B, C]
    drawn = slots_of_rows(row_tokens, order, first_row)  # [B, C]
    void = planned.length > rows  # [B]
    verified, commit = None, run
    if lossless is not None:
        checks = torch.where(lossless & ~void, run, 0)  # [B]: row j checks slot j + 1, the last draws the next
        checked = torch.nn.functional.pad(row_tokens.long(), (0, max(capacity - r, 0)))[:, :capacity]  # [B, C]
        accept = accept_drafts(checked, dense_drafts(planned.tokens, checks))  # [B, C]
        verified, commit = verify_dense(planned, checks, accept, checked, window_size, mask_id)
        commit = torch.where(lossless & void, 0, commit)
    following = fill_masks(planned, commit, entropy, drawn, entropy_threshold[slots], pos_penalty[slots], mask_id,
                           verified, fill_first)
    skipped = drop_leading(planned, commit, mask_id)  # a void window: the same slots, none filled
    following = WindowBatch(torch.where(void[:, None], skipped.tokens, following.tokens),
                            torch.where(void[:, None], skipped.filled, following.filled),
                            torch.where(void, skipped.length, following.length))
    committed_len = start + commit
    plan = plan_windows(following, window_size, committed_len, limit)
    width = max(2, r)  # width 1 would read as one token each, not a -1-padded run
    returned = leading_runs(plan, width)
    if lossless is not None:
        columns = torch.arange(width, device=commit.device)[None]  # [1, width]
        verified_run = torch.where(columns < commit[:, None], planned.tokens[:, :width], -1).to(torch.int32)
        returned = torch.where(lossless[:, None], verified_run, returned)
    return (plan.windows.tokens, plan.windows.filled, plan.windows.length, plan.order, committed_len, returned, void)


def zero_window_step(draws: torch.Tensor, committed_len: torch.Tensor, window_size: torch.Tensor, capacity: int,
                     limit: int, mask_id: int, width: int) -> tuple:
    """The next windows of windows of W 0 (their leading run alone, whose KV the step wrote): each
    starts with its draw (``draws`` [B], the token drawn from its run's last row) filled in slot 0,
    after ``committed_len`` [B] tokens, planned with ``window_size`` [B] slots after it, as the
    reference decoder's AR step leaves its next window (``core.batch.plan_after_draw``). Returns the
    plan and the tokens each returns now ([B, width] int32: its draw, which is its next leading
    run, then -1)."""
    plan = plan_after_draw(draws, window_size, committed_len, limit, capacity, mask_id)
    returned = torch.full((draws.shape[0], width), -1, dtype=torch.int32, device=draws.device)
    returned[:, 0] = draws
    return plan, returned


def check_rows(lossless: torch.Tensor, run: torch.Tensor, rows_per_window: int) -> torch.Tensor:
    """[B, R] bool: the logits rows of a fixed-rows step that are a lossless window's leading-run
    rows (its first ``run`` [B] rows where ``lossless`` [B]): AR rows, drawn without the mask ban."""
    return lossless[:, None] & (torch.arange(rows_per_window, device=run.device)[None] < run[:, None])


def leading_runs(plan: BatchPlan, width: int) -> torch.Tensor:
    """[P, width] int32: each planned window's leading run (what its forward commits), padded with
    -1, as vLLM reads a step's sampled tokens."""
    columns = torch.arange(width, device=plan.num_commit.device)[None]  # [1, width]
    return torch.where(columns < plan.num_commit[:, None], plan.windows.tokens[:, :width], -1).to(torch.int32)


def _greedy(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[N] each mask row's greedy draw: ``sample``'s, every row greedy."""
    return sample(logits, SamplingBatch(None, None, None, None), mask_id)


def plan_rows(plan_slots: np.ndarray, starts: np.ndarray, device: torch.device,
              window_sizes: np.ndarray | None = None) -> tuple[torch.Tensor, ...]:
    """The slots ([P] int64) and start positions ([P] int64) of the windows planned in a step, and
    their W where given (``window_sizes`` [P]), on the device in one copy: rows of one tensor."""
    rows = [plan_slots, starts] if window_sizes is None else [plan_slots, starts, window_sizes]
    return tuple(torch.from_numpy(np.stack(rows).astype(np.int64, copy=False)).to(device, non_blocking=True))


def compiled_window_step(table: WindowTable, logits_of_rows: Callable[[int], torch.Tensor],
                         window_sizes: Iterable[int], limit: int, backend: str | Callable = "inductor",
                         fail_on_miss: bool = False, runs: Counter | None = None,
                         fixed_rows: bool = False) -> Callable:
    """``plain_window_step`` (or with ``fixed_rows`` ``fixed_rows_window_step``) compiled, its
    variants compiled now rather than in a request's step.

    torch.compile specialises sizes 1, so one window or one mask row compiles apart from larger
    ones, a greedy step (no draws given) apart from one with draws, and its guards check each
    input's layout (a view, its strides). W reaches the step as a tensor per window (a row of
    ``plan_rows``' copy, as the runners pass it), so its values make no variant; ``window_sizes``: the
    W the steps will use, whose largest bounds the mask rows. So every variant is run here once, on empty windows
    laid out as ``table``'s (the live table may hold windows whose masks these few rows would not
    cover). Its inputs are made as the runner makes them: ``logits_of_rows(n)`` gives n logits rows
    from the model's own logits computation (a padded vocabulary makes them a strided view), and the
    draws, slots and starts come from ``sample`` and ``plan_rows``, in inference mode as a step runs
    (dynamo guards on it: a warm-up outside it left every GPU step eager). After that nothing
    compiles: a variant not compiled here runs eagerly rather than compiling inside a request's step
    (seconds: the H100 showed two such stalls at batch 1; lab notebook 5.4), or raises with
    ``fail_on_miss`` (for tests). ``runs["compiled"]`` counts the calls after start-up that ran
    compiled code (an eager fallback is silent otherwise)."""
    begin = time.perf_counter()
    runs = Counter() if runs is None else runs
    function = fixed_rows_window_step if fixed_rows else plain_window_step
    step = torch.compile(function, dynamic=True, backend=_counting(backend, runs))
    # Without duck shaping: sizes that happen to be equal here (two windows, and the two rows of
    # plan_rows' tensor) must not become one symbol, which a later step's sizes would break.
    # The guards check inference mode and which inputs were made in it: a step runs in it (vLLM's
    # execute_model) and makes its own tensors there, the table's were made at the runner's start.
    with torch.inference_mode(table.windows.tokens.is_inference()):
        empty = WindowBatch.empty(table.num_slots, table.capacity, table.mask_id, table.device)
        order, committed_len = torch.zeros_like(table.order), torch.zeros_like(table.committed_len)
        tau, lam = torch.zeros_like(table.entropy_threshold), torch.zeros_like(table.pos_penalty)
    # Each variant is an entry of the function's cache; past dynamo's default limit of 8 it would
    # run a variant eagerly.
    with (torch.fx.experimental._config.patch(use_duck_shape=False), torch._dynamo.config.patch(recompile_limit=64),
          torch.inference_mode()):
        for window_size, windows, masks, greedy in itertools.product(sorted(set(window_sizes)), (1, 2), (1, 2),
                                                                     (True, False)):
            if fixed_rows:
                # R logits rows per window, from 1 to the largest W (the most rows a step's windows
                # forward, FixedRows.logits_rows_per_window): 1 compiles apart, the rest share a
                # variant. Plain windows only: lossless ones run eagerly.
                masks = max(window_sizes) if masks == 2 else 1
                if windows > table.num_slots:
                    continue
            elif windows > table.num_slots or masks > window_size or windows == masks == 2:
                continue  # (2 windows of 2 masks: a variant 2 windows of 1 mask stands for)
            logits = logits_of_rows(windows * masks)
            tokens = None if greedy else _greedy(logits, table.mask_id)
            # Slots and, in one copy, the windows' starts (fixed rows: the rows each forwards, as
            # FixedRows.prepare makes them, which gathers runs and starts from the table).
            # W per window, as the runner passes it (a row of the same copy).
            second = np.full(windows, 2 * window_size) if fixed_rows else np.zeros(windows, np.int64)
            slots, starts_or_rows, sizes = plan_rows(np.arange(windows), second, table.device,
                                                     np.full(windows, window_size))
            if fixed_rows:
                step(empty, order, slots, logits, tokens, leading_filled(empty.filled[slots]), committed_len[slots],
                     starts_or_rows, tau, lam, sizes, limit, table.mask_id, masks, None)
            else:
                step(empty, slots, logits, tokens, tau, lam, starts_or_rows, sizes, limit, table.mask_id)
    if table.device.type == "cuda":
        torch.cuda.synchronize(table.device)
    logger.info("WeDLM: compiled the window step in %.1f s", time.perf_counter() - begin)
    runs["compiled"] = 0  # the warm-up's runs are not steps

    if not fail_on_miss:
        return torch._dynamo.run(step)  # compiled code where its guards hold, else eager; never compiles

    def run(*args):
        with torch.compiler.set_stance("fail_on_recompile"):
            return step(*args)

    return run


def _counting(backend: str | Callable, runs: Counter) -> Callable:
    """``backend`` (a torch.compile backend), its compiled graphs counting their calls in
    ``runs["compiled"]``."""
    compile_graph = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

    def compile_counted(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        compiled = compile_graph(graph, example_inputs)

        def run(*args):
            runs["compiled"] += 1
            return compiled(*args)

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # called as the compiled function is
        return run

    return compile_counted
