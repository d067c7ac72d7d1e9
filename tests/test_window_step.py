"""adapter/window_step.py: the runner's steps of plain windows (the functions the GPU worker
compiles: the synchronous one and the one of fixed window rows) equal the one-request statement of
WeDLM's step (core/step.py) for every window of a table, and the synchronous one's packet is what
the host half of the window table reads; with lossless windows, the fixed-rows step equals the
synchronous runner's core functions.

Random planned windows at scattered slots of a larger table, every window size, tau (including
None) and lambda, a KV room that cuts some windows short, greedy and sampled draws, chained over
several steps.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from test_batch_step import M, V, logits_like, random_window
from vllm_wedlm.adapter.window_step import (
    compiled_window_step,
    fixed_rows_window_step,
    plain_window_step,
    plan_rows,
)
from vllm_wedlm.adapter.window_table import WindowTable
from vllm_wedlm.core import WeDLMParams, finish_step, plan_step
from vllm_wedlm.core.batch import WindowBatch, leading_filled
from vllm_wedlm.core.sampling import SamplingBatch, sample
from vllm_wedlm.core.selection import row_entropy

pytestmark = pytest.mark.fast  # the fast tier: `pytest -m fast` (README)


def _random_table(rng: random.Random, window_size: int, batch_size: int, table_slots: int):
    """A table of ``table_slots`` with the planned windows of ``batch_size`` requests at random slots
    (random tau and lambda), as the previous step left them; (table, slots, params, committed, plans,
    limit)."""
    table = WindowTable(2 * window_size, M, torch.device("cpu"), slots=table_slots)
    slots = rng.sample(range(table_slots), batch_size)
    params = [WeDLMParams(rng.choice([None, 0.05, 0.4, 1.5, 100.0]), rng.choice([0.0, 0.02, 0.5]))
              for _ in range(batch_size)]
    for slot, p in zip(slots, params, strict=True):
        table.set_params(slot, p)
    committed = [rng.randint(0, 40) for _ in range(batch_size)]
    limit = max(committed) + window_size + 2  # some windows meet the KV room's end
    plans = [plan_step(None if rng.random() < 0.2 else random_window(rng, min(window_size, limit - c)),
                     window_size, c, limit, M) for c in committed]
    for slot, plan, c in zip(slots, plans, committed, strict=True):
        n = len(plan.window)
        table.windows.tokens[slot, :n], table.windows.filled[slot, :n] = plan.window.tokens, plan.window.filled
        table.windows.length[slot] = n
        # The device's order is a permutation of all C slots (padding last), as core.batch plans it.
        table.order[slot] = torch.cat([plan.order, torch.arange(n, table.capacity)])
        table.committed_len[slot] = c
    return table, slots, params, committed, plans, limit


def _draws(rng: random.Random, gen: torch.Generator, logits: torch.Tensor, greedy: bool):
    """(the draws a step is given, None when ``greedy``: it draws each row's argmax itself; the
    draws it uses)."""
    if greedy:
        if len(logits):
            logits[rng.randrange(len(logits)), M] = 1e3  # the mask token is never drawn
        return None, sample(logits, SamplingBatch(None, None, None, None), M)
    drawn = torch.randint(0, V, (len(logits),), generator=gen)  # any draws (a greedy one is one of them)
    drawn[drawn == M] = 0
    return drawn, drawn


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy-inside", "draws-given"])
@pytest.mark.parametrize("window_size", [1, 3, 16])
def test_plain_window_step_equals_per_request_step(window_size, greedy):
    rng = random.Random(window_size + 10 * greedy)
    gen = torch.Generator().manual_seed(window_size)
    table, slots, params, committed, plans, limit = _random_table(rng, window_size, 12, 40)

    slots_t = torch.tensor(slots)
    for step in range(5):
        counts = [plan.num_masks for plan in plans]
        logits = logits_like(rng, gen, sum(counts))  # [N, V]: the mask rows, window by window
        given, tokens = _draws(rng, gen, logits, greedy)
        next_committed = [c + plan.num_commit for c, plan in zip(committed, plans, strict=True)]
        before = table.windows.tokens.clone()
        *following, packet = plain_window_step(table.windows, slots_t, logits, given, table.entropy_threshold,
                                               table.pos_penalty, torch.tensor(next_committed), window_size, limit, M)
        assert torch.equal(table.windows.tokens, before)  # pure: the runner stores the result
        table.windows.store(slots_t, WindowBatch(*following))
        table.receive(np.array(slots), packet.numpy(), np.array(next_committed))

        entropy, start = row_entropy(logits), 0
        for row, (plan, p) in enumerate(zip(plans, params, strict=True)):
            seg = slice(start, start + counts[row])
            start += counts[row]
            expected = plan_step(finish_step(plan, entropy[seg], tokens[seg], p), window_size, next_committed[row],
                                 limit, M)
            n, slot = len(expected.window), slots[row]
            assert table.windows.tokens[slot, :n].tolist() == expected.window.tokens.tolist(), (step, row)
            assert table.windows.filled[slot, :n].tolist() == expected.window.filled.tolist(), (step, row)
            assert int(table.windows.length[slot]) == n
            host = table.host
            assert host.input_ids[slot, :n].tolist() == expected.input_ids.tolist()
            assert host.order[slot, :n].tolist() == expected.order.tolist()
            assert (host.length[slot], host.num_commit[slot], host.num_masks[slot]) == (
                n, expected.num_commit, expected.num_masks)
            assert host.committed_len[slot] == next_committed[row]
            plans[row] = expected
        committed = next_committed
    assert sum(committed) > 0


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy-inside", "draws-given"])
@pytest.mark.parametrize("window_size", [1, 3, 16])
def test_fixed_rows_window_step_equals_per_request_step(window_size, greedy):
    """Fixed window rows (async scheduling): each window's W logits rows after its leading run, in
    physical order, finish it and plan the next one as the one-request step does; the leading run
    of each next window comes back padded with -1, and the device table's record of where each
    window starts and of its order is the next plan's. ``greedy``: no draws given, the step draws
    each row's argmax itself (never the mask token). A window given fewer rows than it has (the
    scheduler predicted a shorter run) is void: it drops its run and fills nothing."""
    rng = random.Random(window_size + 10 * greedy)
    gen = torch.Generator().manual_seed(window_size)
    batch_size = 12
    table, slots, params, committed, plans, limit = _random_table(rng, window_size, batch_size, 40)
    slots_t = torch.tensor(slots)
    width = max(2, window_size)
    voids = 0
    for step in range(5):
        logits = logits_like(rng, gen, batch_size * window_size)  # [B * W, V]: W rows after each run
        tokens, drawn = _draws(rng, gen, logits, greedy)
        run = torch.tensor([plan.num_commit for plan in plans])
        start = table.committed_len[slots_t].clone()
        # Rows forwarded: 2W, the window's own, or (void) W and a run shorter than its own.
        rows = [window_size + rng.randrange(plan.num_commit) if plan.num_commit and rng.random() < 0.3
                else rng.choice([2 * window_size, len(plan.window)]) for plan in plans]
        tokens_, filled, length, order, committed_len, run_tokens, void = fixed_rows_window_step(
            table.windows, table.order, slots_t, logits, tokens, run, start, torch.tensor(rows),
            table.entropy_threshold, table.pos_penalty, window_size, limit, M)
        table.keep(slots_t, WindowBatch(tokens_, filled, length), order, committed_len)

        entropy = row_entropy(logits).view(batch_size, window_size)
        drawn = drawn.view(batch_size, window_size)
        for row, (plan, p) in enumerate(zip(plans, params, strict=True)):
            # Physical row k of the window is logits row k - num_commit; its masks are its last rows.
            num_filled = int(plan.window.filled.sum())
            masks = slice(num_filled - plan.num_commit, num_filled - plan.num_commit + plan.num_masks)
            next_committed = committed[row] + plan.num_commit
            assert bool(void[row]) == (len(plan.window) > rows[row])
            if void[row]:  # the run's KV written, nothing filled
                voids += 1
                following = plan.window.dropped(plan.num_commit)
            else:
                following = finish_step(plan, entropy[row, masks], drawn[row, masks], p)
            expected = plan_step(following, window_size, next_committed, limit, M)
            n, slot = len(expected.window), slots[row]
            assert table.windows.tokens[slot, :n].tolist() == expected.window.tokens.tolist(), (step, row)
            assert table.windows.filled[slot, :n].tolist() == expected.window.filled.tolist(), (step, row)
            assert int(table.windows.length[slot]) == n
            assert table.order[slot, :n].tolist() == expected.order.tolist()
            assert int(table.committed_len[slot]) == next_committed
            lead = expected.input_ids[: expected.num_commit].tolist()
            assert run_tokens[row].tolist() == (lead + [-1] * width)[:width]
            plans[row], committed[row] = expected, next_committed
    assert sum(plan.num_commit for plan in plans) + sum(committed) > 0
    assert voids > 0


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["sync", "fixed-rows"])
def test_start_up_compiles_every_variant_a_step_meets(fixed_rows):
    """``compiled_window_step`` compiles, at start-up, every variant that the runner's steps then
    call, with the inputs laid out and made as the runner's are (logits a strided view when the
    vocabulary is padded, slots and starts two rows of one tensor, all made in inference mode, in
    which vLLM runs a step; the table made outside it or, as a check of the other kind, in it;
    draws given or, greedy, not). After it, no step compiles (``fail_on_miss`` raises if one would),
    every step runs the compiled code, and that gives the eager function's result. The engine's own
    choice on a miss, eager without compiling, is checked on a variant left out. torch.compile with
    a backend that runs the traced graph as is: dynamo's guards, no C++ compiler. W comes per window
    (an adaptive window's, 1 included), a row of the slots' copy. ``fixed_rows``: the step of fixed
    window rows (R logits rows per window, from 1 to the largest W)."""
    window_size, padded_vocab, num_compiles, num_compiled_runs = 4, 16, [], []
    function = fixed_rows_window_step if fixed_rows else plain_window_step
    window_sizes = (window_size,)
    logits_at = 3 if fixed_rows else 2  # the logits' place among the step's arguments

    def backend(graph, example_inputs):
        num_compiles.append(1)

        def run(*args):
            num_compiled_runs.append(1)
            return graph.forward(*args)

        return run

    weight = torch.randn(padded_vocab, 8, generator=torch.Generator().manual_seed(0))

    def logits_of_rows(rows: int) -> torch.Tensor:  # vLLM's lm_head: padded rows, cut to the vocabulary
        return (torch.randn(rows, 8) @ weight.T)[:, :V]

    def step_args(table: WindowTable, slots: list[int]) -> tuple:  # in inference mode, as the runner's step
        for slot in slots:  # a new window of 1, 2 or W masks (1: a step of one logits row)
            table.windows.tokens[slot], table.windows.filled[slot] = M, False
            table.windows.length[slot] = rng.choice([1, 2, window_size])
            table.order[slot] = torch.arange(table.capacity)  # a window of masks: in logical order
        num_masks = int((table.windows.length[slots] - table.windows.filled[slots].sum(1)).sum())
        # Fixed rows: R logits rows per window, the most rows a window of the step forwards, up to W.
        rows_per_window = rng.choice([1, 2, 3, window_size])
        logits = logits_of_rows(len(slots) * rows_per_window if fixed_rows else num_masks)
        tokens = None if rng.random() < 0.5 else sample(logits, SamplingBatch(None, None, None, None), M)
        sizes = np.array([rng.choice([1, 2, window_size]) for _ in slots])  # each next window's W
        slots_t, starts, sizes_t = plan_rows(np.array(slots), np.full(len(slots), 10), torch.device("cpu"), sizes)
        if fixed_rows:  # slots, rows and W rows of one tensor, as FixedRows.prepare makes them
            slots_t, rows, sizes_t = plan_rows(np.array(slots), np.full(len(slots), 2 * window_size),
                                               torch.device("cpu"), sizes)
            run, starts = leading_filled(table.windows.filled[slots_t]), table.committed_len[slots_t]
            return (table.windows, table.order, slots_t, logits, tokens, run, starts, rows, table.entropy_threshold,
                    table.pos_penalty, sizes_t, 64, M, rows_per_window, None)  # no lossless
        return (table.windows, slots_t, logits, tokens, table.entropy_threshold, table.pos_penalty, starts,
                sizes_t, 64, M)

    rng = random.Random(0)
    for table_slots, table_in_inference_mode in ((1, False), (6, False), (6, True)):
        torch._dynamo.reset()
        with torch.inference_mode(table_in_inference_mode):
            table = WindowTable(2 * window_size, M, torch.device("cpu"), slots=table_slots)
        step = compiled_window_step(table, logits_of_rows, window_sizes, 64, backend=backend, fail_on_miss=True,
                                    fixed_rows=fixed_rows)
        warmed = len(num_compiles)
        for batch in [1, 1, 1, 1, table_slots, 2 if table_slots > 1 else 1, table_slots] * (2 if fixed_rows else 1):
            with torch.inference_mode():  # the runner's step
                args = step_args(table, rng.sample(range(table_slots), batch))
                runs = len(num_compiled_runs)
                compiled, eager = step(*args), function(*args)
                assert len(num_compiled_runs) == runs + 1  # the compiled code ran, not an eager fallback
            assert all(torch.equal(a, b) for a, b in zip(compiled, eager, strict=True))
        assert len(num_compiles) == warmed

    # The engine's step on a variant start-up did not compile (float64 logits): eager, no compile,
    # and not counted as compiled.
    runs = Counter()
    engine_step = compiled_window_step(table, logits_of_rows, window_sizes, 64, backend=backend, runs=runs,
                                       fixed_rows=fixed_rows)
    compiled_so_far, compiled_runs = len(num_compiles), len(num_compiled_runs)
    assert runs == {"compiled": 0}  # the warm-up's runs are not counted
    with torch.inference_mode():
        float64 = (*args[:logits_at], args[logits_at].double(), *args[logits_at + 1:])
        assert all(torch.equal(a, b) for a, b in zip(engine_step(*float64), function(*float64), strict=True))
        assert len(num_compiled_runs) == compiled_runs and runs["compiled"] == 0
        engine_step(*args)  # a variant it did compile: the compiled code
        assert len(num_compiled_runs) == compiled_runs + 1 and runs["compiled"] == 1
    assert len(num_compiles) == compiled_so_far


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy-inside", "draws-given"])
@pytest.mark.parametrize("window_size", [1, 3, 8])
def test_fixed_rows_lossless_windows_equal_the_synchronous_step(window_size, greedy):
    """Fixed window rows with lossless windows (``lossless``), mixed with plain ones: each window's
    2W logits rows (a lossless window's first 2W, whose leading-run rows verify its fills on the
    device; a plain one's after its run) give what the synchronous runner's step gives from exactly
    the rows it asks for (``core.batch.verify_windows``, ``finish_windows``, ``plan_windows``): the
    next windows, where they start, and what each returns now, a lossless window its verified run
    (its KV written this step), a plain one its next leading run. Greedy draws never give a mask
    row the mask token, but a lossless window's leading-run rows are AR rows, which may."""
    from vllm_wedlm.core.batch import finish_windows, plan_windows, verification_drafts, verify_windows

    rng = random.Random(window_size + 100 * greedy)
    gen = torch.Generator().manual_seed(window_size)
    w, q, batch_size = window_size, 2 * window_size, 16
    table = WindowTable(q, M, torch.device("cpu"), slots=24)
    slots = torch.tensor(rng.sample(range(24), batch_size))
    lossless = torch.tensor([rng.random() < 0.6 for _ in range(batch_size)])
    for slot in slots.tolist():
        table.set_params(slot, WeDLMParams(rng.choice([None, 0.4, 100.0]), rng.choice([0.0, 0.5])))
    # Windows as a previous step left them: fills anywhere among W slots after a leading run; a
    # lossless window's slot 0 is always filled (the model's own next token).
    windows = WindowBatch.empty(batch_size, q, M)
    for b in range(batch_size):
        length = rng.randint(min(3, w), w)
        filled = [rng.random() < 0.5 for _ in range(length)]
        if lossless[b]:  # a leading run of unverified fills after slot 0
            lead = rng.randint(min(3, length), length)
            filled[:lead] = [True] * lead
        windows.filled[b, :length] = torch.tensor(filled)
        windows.tokens[b, :length] = torch.where(torch.tensor(filled), torch.randint(0, M, (length,), generator=gen), M)
        windows.length[b] = length
    start = torch.tensor([rng.randint(0, 30) for _ in range(batch_size)])
    limit = int(start.max()) + w + 3  # some windows meet the KV room's end
    plan = plan_windows(windows, w, start, limit)
    table.keep(slots, plan.windows, plan.order, start)
    run = leading_filled(plan.windows.filled)  # [B]
    length = plan.windows.length  # [B]: the rows each window forwards (the synchronous step's)

    physical = logits_like(rng, gen, batch_size * q).view(batch_size, q, V)  # [B, 2W, V] each physical row's
    # Fills that pass their check (the row before draws them): none, all but the last, or all of a
    # window's, so that runs are cut at once, cut late and accepted whole.
    agree = [(b, j) for b in range(batch_size) if lossless[b] for j in range(int(run[b]) - 1 - (b % 3 == 1))
             if b % 3]
    for b, j in agree:
        physical[b, j, plan.windows.tokens[b, j + 1]] = 1e3
    if greedy:  # a leading-run row that draws the mask token (it checks nothing: its run's last row)
        for b in range(batch_size):
            if lossless[b]:
                physical[b, int(run[b]) - 1, M] = 2e3
    k = torch.arange(q)[None]  # [1, 2W]
    from_row = torch.where(lossless, 0, run)[:, None]  # [B, 1]
    fixed_rows = torch.minimum(from_row + k, length[:, None] - 1)  # [B, 2W] the fixed layout's rows
    logits = physical.gather(1, fixed_rows[:, :, None].expand(-1, -1, V)).reshape(-1, V)  # [B * 2W, V]
    ar_row = (lossless[:, None] & (k < run[:, None])).flatten()  # [B * 2W] leading-run rows of lossless windows
    drawn = torch.randint(0, V, (batch_size * q,), generator=gen)  # any draws but the mask at mask rows
    drawn[(drawn == M) & ~ar_row] = 0
    for b, j in agree:  # a lossless window's logits row j is its physical row j
        drawn[b * q + j] = plan.windows.tokens[b, j + 1]
    tokens = None if greedy else drawn
    per_row = sample(logits, SamplingBatch(None, None, None, ~ar_row), M) if greedy else drawn  # [B * 2W]

    *next_windows, order, committed_len, returned, void = fixed_rows_window_step(
        table.windows, table.order, slots, logits, tokens, run, start, length, table.entropy_threshold,
        table.pos_penalty, w, limit, M, q, lossless)

    # The synchronous step: check rows first (a lossless window's leading run), then mask rows.
    per_row = per_row.view(batch_size, q)
    entropy = row_entropy(logits).view(batch_size, q)
    checks = torch.where(lossless, run, 0)
    check_tokens = torch.cat([per_row[b, : int(checks[b])] for b in range(batch_size)])  # [R]
    accepted = (check_tokens == verification_drafts(plan.windows.tokens, checks))
    verified, commit = verify_windows(plan.windows, checks, accepted, check_tokens, w, M)
    mask_rows = [(torch.arange(int(length[b]) - int(plan.num_masks[b]), int(length[b]))
                  - int(from_row[b])) for b in range(batch_size)]  # each one's mask rows among its logits rows
    following = finish_windows(plan.windows, commit,
                               torch.cat([entropy[b, rows] for b, rows in enumerate(mask_rows)]),
                               torch.cat([per_row[b, rows] for b, rows in enumerate(mask_rows)]),
                               table.entropy_threshold[slots], table.pos_penalty[slots], M, verified)
    expected = plan_windows(following, w, start + commit, limit)

    assert not void.any()
    assert torch.equal(committed_len, start + commit)
    tokens_, filled_, length_ = next_windows
    assert torch.equal(tokens_, expected.windows.tokens) and torch.equal(filled_, expected.windows.filled)
    assert torch.equal(length_, expected.windows.length) and torch.equal(order, expected.order)
    width = max(2, q)
    for b in range(batch_size):
        now = (plan.windows.tokens[b, : int(commit[b])] if lossless[b]
               else expected.windows.tokens[b, : int(expected.num_commit[b])]).tolist()
        assert returned[b].tolist() == (now + [-1] * width)[:width], b
    assert lossless.any() and (~lossless).any()
    if w > 1:  # runs of fills accepted, and cut at a rejected one
        assert (commit[lossless] > 1).any() and (commit[lossless] < run[lossless]).any(), (commit, run)
