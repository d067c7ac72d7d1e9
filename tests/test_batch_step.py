"""core/batch.py and core/sampling.py compute, for a whole batch at once, exactly what the
one-request statement of WeDLM's step (core/step.py, core/window.py) computes window by window.

Random windows in every state (all masks, a leading filled run, holes, fully filled, cut short by
max_model_len), every window size, tau (including None), lambda and sampling setting (greedy,
temperature, top-k, top-p, both, seeded, AR rows that may draw the mask token), chained over
several steps so that each batch mixes requests at different stages.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from vllm_wedlm.core import WeDLMParams, Window, finish_step, plan_step
from vllm_wedlm.core.batch import (
    WindowBatch,
    fill_masks,
    finish_windows,
    leading_filled,
    plan_after_draw,
    plan_windows,
    reopen,
    slots_of_rows,
)
from vllm_wedlm.core.params import selection_tensors
from vllm_wedlm.core.sampling import SamplingBatch, SamplingSpec, sample, sample_request
from vllm_wedlm.core.selection import row_entropy

pytestmark = pytest.mark.fast  # the fast tier: `pytest -m fast` (README)

M = 7  # mask id
V = 12  # vocabulary
TAUS = [None, 0.05, 0.4, 1.5, 100.0]
LAMBDAS = [0.0, 0.02, 0.5]
SAMPLINGS = [dict(), dict(temperature=0.7), dict(temperature=1.3, top_k=3), dict(temperature=0.9, top_p=0.6),
             dict(temperature=1.0, top_k=4, top_p=0.8), dict(temperature=0.5, ban_mask_token=False)]


def random_window(rng: random.Random, size: int) -> Window:
    """A window between steps: ``size`` slots, each filled with a random token or still masked."""
    style = rng.choice(["masks", "run", "holes", "full", "random"])
    filled = {"masks": [False] * size, "full": [True] * size,
              "run": [i < rng.randint(1, size) for i in range(size)],
              "holes": [i % 2 == 1 for i in range(size)],
              "random": [rng.random() < 0.5 for _ in range(size)]}[style]
    tokens = [rng.choice([t for t in range(V) if t != M]) if f else M for f in filled]
    return Window(torch.tensor(tokens, dtype=torch.long), torch.tensor(filled))


def stack(windows: list[Window | None], capacity: int) -> WindowBatch:
    batch = WindowBatch.empty(len(windows), capacity, M)
    for row, window in enumerate(windows):
        if window is not None:
            n = len(window)
            batch.tokens[row, :n], batch.filled[row, :n], batch.length[row] = window.tokens, window.filled, n
    return batch


def logits_like(rng: random.Random, gen: torch.Generator, rows: int) -> torch.Tensor:
    """[rows, V]: mostly random, some peaked, some exactly uniform (entropy ties)."""
    logits = torch.randn(rows, V, generator=gen) * rng.choice([0.5, 3.0, 10.0])
    for r in range(rows):
        if rng.random() < 0.2:
            logits[r] = 0.0
    return logits


def seeded(spec: dict, seed: int) -> SamplingSpec:
    gen = torch.Generator().manual_seed(seed) if spec.get("temperature", 0) > 0 else None
    return SamplingSpec(**spec, generator=gen)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("window_size", [1, 2, 5, 16])
def test_batched_step_equals_per_request_step(window_size, adaptive):
    """``adaptive``: each step plans every window with its own W between 1 and ``window_size`` (the
    engine's adaptive window picks one W per step; rows differ here to cover more), so windows grow
    and shrink from step to step."""
    rng = random.Random(window_size + 100 * adaptive)
    gen = torch.Generator().manual_seed(window_size)
    combos = list(itertools.product(TAUS, LAMBDAS, range(len(SAMPLINGS))))
    rng.shuffle(combos)
    batch_size = len(combos)
    params = [WeDLMParams(tau, lam) for tau, lam, _ in combos]
    specs = [SAMPLINGS[s] for _, _, s in combos]
    committed = [rng.randint(0, 50) for _ in range(batch_size)]
    # A third of the requests end their KV room a few slots after the window (max_model_len).
    limits = [c + rng.randint(1, window_size + 3) if rng.random() < 0.3 else 10_000 for c in committed]
    # Some start from nothing (a new request), the others from a random window that fits the room.
    windows: list[Window | None] = []
    for c, limit in zip(committed, limits, strict=True):
        size = min(window_size, limit - c)
        windows.append(None if rng.random() < 0.2 else random_window(rng, size))
    capacity = 2 * window_size
    batch = stack(windows, capacity)
    tau, lam = selection_tensors(params)

    for step in range(6):
        committed_t = torch.tensor(committed)
        sizes = [rng.randint(1, window_size) if adaptive else window_size for _ in range(batch_size)]
        plan = plan_windows(batch, torch.tensor(sizes), committed_t, torch.tensor(limits))
        expected = [plan_step(w, size, c, lim, M)
                    for w, size, c, lim in zip(windows, sizes, committed, limits, strict=True)]
        for row, exp in enumerate(expected):
            n = len(exp.window)
            assert int(plan.windows.length[row]) == n
            if windows[row] is not None:  # a filled slot is never dropped, whatever the new W
                assert n >= windows[row].filled_end()
                assert plan.windows.filled[row, :n].sum() == windows[row].filled.sum()
            assert plan.order[row, :n].tolist() == exp.order.tolist()
            assert plan.input_ids[row, :n].tolist() == exp.input_ids.tolist()
            assert int(plan.num_commit[row]) == exp.num_commit
            assert int(plan.num_masks[row]) == exp.num_masks

        counts = [exp.num_masks for exp in expected]
        logits = logits_like(rng, gen, sum(counts))
        seeds = [rng.randrange(2**31) for _ in range(batch_size)]
        tokens = sample(logits, SamplingBatch.of([seeded(s, seed) for s, seed in zip(specs, seeds, strict=True)],
                                                 counts), M)
        entropy = row_entropy(logits)
        batch = finish_windows(plan.windows, plan.num_commit, entropy, tokens, tau, lam, M)
        if not adaptive:
            # Fixed window rows (async scheduling): the W rows after each leading run, junk where no
            # mask sits, read slot by slot, finish the windows the same way.
            assert_fixed_rows_finish_alike(plan, entropy, tokens, counts, window_size, tau, lam, batch, gen)

        start = 0
        for row, (exp, spec, seed) in enumerate(zip(expected, specs, seeds, strict=True)):
            seg = slice(start, start + counts[row])
            start += counts[row]
            row_tokens = sample_request(logits[seg], seeded(spec, seed), M)
            assert tokens[seg].tolist() == row_tokens.tolist(), (step, row, spec)
            nxt = finish_step(exp, entropy[seg], row_tokens, params[row])
            n = len(nxt)
            assert int(batch.length[row]) == n
            assert batch.tokens[row, :n].tolist() == nxt.tokens.tolist(), (step, row)
            assert batch.filled[row, :n].tolist() == nxt.filled.tolist(), (step, row)
            # Past the window: masks, unfilled (what refilling relies on).
            assert (batch.tokens[row, n:] == M).all() and not batch.filled[row, n:].any()
            windows[row] = nxt
            committed[row] += exp.num_commit
    assert sum(committed) > 0


def assert_fixed_rows_finish_alike(plan, entropy: torch.Tensor, tokens: torch.Tensor, counts: list[int],
                                   window_size: int, tau: torch.Tensor, lam: torch.Tensor, expected: WindowBatch,
                                   gen: torch.Generator) -> None:
    """``slots_of_rows`` + ``fill_masks`` on W rows per window (physical rows run..run+W-1, the masks
    last among them, junk in the others) equal ``finish_windows`` on the mask rows alone."""
    batch_size = len(counts)
    rows_entropy = torch.rand(batch_size, window_size, generator=gen) * 10  # junk where no mask is
    rows_tokens = torch.randint(0, M, (batch_size, window_size), generator=gen)
    start = 0
    for row, count in enumerate(counts):
        end = int(plan.windows.length[row]) - int(plan.num_commit[row])  # one past the last mask row, from the run
        assert end <= window_size
        rows_entropy[row, end - count:end] = entropy[start:start + count]
        rows_tokens[row, end - count:end] = tokens[start:start + count]
        start += count
    got = fill_masks(plan.windows, plan.num_commit, slots_of_rows(rows_entropy, plan.order, plan.num_commit),
                     slots_of_rows(rows_tokens, plan.order, plan.num_commit), tau, lam, M)
    for name in ("tokens", "filled", "length"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


@pytest.mark.parametrize("capacity", [2, 8, 32])
def test_a_window_after_a_draw_plans_as_plan_windows_plans_it(capacity):
    """``plan_after_draw`` (a window of W 0's next window, every step) gives ``plan_windows``' plan of
    the same windows, slot for slot, for every W up to the capacity's half and every room left
    before max_model_len (none, part of the window, all of it), with a limit per request or none."""
    rng = random.Random(capacity)
    batch = 64
    draws = torch.tensor([rng.choice([t for t in range(V) if t != M]) for _ in range(batch)])
    sizes = torch.tensor([rng.randint(0, capacity // 2) for _ in range(batch)])
    committed = torch.tensor([rng.randint(0, 40) for _ in range(batch)])
    rooms = torch.tensor([rng.choice([0, 1, rng.randint(0, capacity), 10_000]) for _ in range(batch)])
    windows = WindowBatch.empty(batch, capacity, M)
    windows.tokens[:, 0], windows.filled[:, 0] = draws, True
    for limit in (committed + rooms, None):
        expected = plan_windows(windows, sizes, committed, limit)
        plan = plan_after_draw(draws, sizes, committed, limit, capacity, M)
        assert torch.equal(plan.windows.tokens, expected.windows.tokens)
        assert torch.equal(plan.windows.filled, expected.windows.filled)
        assert torch.equal(plan.windows.length, expected.windows.length)
        assert torch.equal(plan.order, expected.order)
        assert torch.equal(plan.num_commit, expected.num_commit)
        assert torch.equal(plan.num_masks, expected.num_masks)
        assert torch.equal(plan.input_ids, expected.input_ids)
    assert (rooms == 0).any() and (sizes == 0).any()  # the edges this test is for


def test_every_window_fills_at_least_one_mask_and_ties_pick_the_first():
    # Uniform rows tie: with tau None (one per step) the first mask is filled, whatever lambda 0.
    batch = plan_windows(WindowBatch.empty(2, 8, M), 4, torch.tensor([0, 0]), None)
    entropy = row_entropy(torch.zeros(8, V))
    tokens = torch.arange(8)
    tau, lam = selection_tensors([WeDLMParams(None, 0.0), WeDLMParams(0.01, 0.0)])
    nxt = finish_windows(batch.windows, batch.num_commit, entropy, tokens, tau, lam, M)
    assert nxt.filled[:, :4].tolist() == [[True, False, False, False]] * 2
    assert nxt.tokens[:, 0].tolist() == [0, 4]


def test_a_grammars_window_always_fills_its_first_mask():
    # Two windows of 4 masks, the last mask the surest: without fill_first only it is filled; with
    # it (the second window) the first mask too, from its own row's draw.
    batch = plan_windows(WindowBatch.empty(2, 8, M), 4, torch.tensor([0, 0]), None)
    rows = torch.zeros(8, V)
    rows[[3, 7], 5] = 20.0  # [N, V]: each window's last mask row is nearly one-hot
    tokens = torch.tensor([1, 2, 3, 5, 1, 2, 3, 5])
    tau, lam = selection_tensors([WeDLMParams(0.1, 0.0)] * 2)
    nxt = finish_windows(batch.windows, batch.num_commit, row_entropy(rows), tokens, tau, lam, M,
                         fill_first=torch.tensor([False, True]))
    assert nxt.filled[:, :4].tolist() == [[False, False, False, True], [True, False, False, True]]
    assert nxt.tokens[1, 0] == 1 and leading_filled(nxt.filled).tolist() == [0, 1]


def test_a_rejected_fill_becomes_a_mask_and_ends_the_run():
    # Leading run of 3, a hole, then a fill: reopening slot 1 leaves a run of 1 and keeps the fills
    # after it; the next plan keeps W slots after that run and every fill.
    tokens = torch.tensor([[1, 2, 3, M, 4, M, M, M]])
    filled = torch.tensor([[True, True, True, False, True, False, False, False]])
    windows = WindowBatch(tokens, filled, torch.tensor([6]))
    cut = reopen(windows, torch.tensor([1]), M)
    assert cut.tokens.tolist() == [[1, M, 3, M, 4, M, M, M]]
    assert cut.filled.tolist() == [[True, False, True, False, True, False, False, False]]
    assert leading_filled(cut.filled).tolist() == [1]
    plan = plan_windows(cut, 3, torch.tensor([10]), None)
    assert plan.num_commit.tolist() == [1] and plan.windows.length.tolist() == [5]  # run 1 + W 3, fill at slot 4 kept
    # A slot past the capacity reopens nothing.
    assert torch.equal(reopen(windows, torch.tensor([8]), M).filled, windows.filled)


def test_sampling_rows_follow_their_own_request():
    # Greedy rows ignore the others' settings; an AR row may draw the mask token, a mask row never.
    logits = torch.zeros(4, V)
    logits[:, M] = 10.0
    logits[:, 3] = 5.0
    batch = SamplingBatch.of([SamplingSpec(), SamplingSpec(ban_mask_token=False),
                              SamplingSpec(temperature=0.01, top_k=1, generator=torch.Generator().manual_seed(1))],
                             [2, 1, 1])
    assert sample(logits, batch, M).tolist() == [3, 3, M, 3]
