"""The adaptive window's choice of W (``core/window_policy.py``), in pure PyTorch.

``choose_window_sizes`` must give the best W of every request of a batch under its own model of
commits and of a step's cost: checked against every choice on small batches, over synthetic
commit histories and cost curves (host-bound, with a knee, compute-bound). And the model must move
W where it should: to 1 where windows commit about one token per forward, to the whole window where
they commit it, smaller on a compute-bound batch than on a host-bound one.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_wedlm.adapter.async_gate import step_cost
from vllm_wedlm.core.window_policy import (
    CENSORED_BONUS,
    COMMIT_AVERAGE_WEIGHT,
    MIN_SLOT_GAIN,
    SINGLE_SLOT_BONUS,
    StepCost,
    best_prefix_sizes,
    choose_step,
    choose_step_on_host,
    choose_window_sizes,
    every_usable_slot_pays,
    expected_commits,
    slot_gains,
    update_commit_estimate,
)

pytestmark = pytest.mark.fast

#: The Qwen3-8B shape's layers (its config's sizes), for its cost curve.
QWEN3_8B = SimpleNamespace(hidden_size=4096, num_attention_heads=32, head_dim=128, num_key_value_heads=8,
                           intermediate_size=12288, num_hidden_layers=36)
#: A model whose forward costs next to nothing beside the host's work (the shipped micro's shape).
MICRO = SimpleNamespace(hidden_size=128, num_attention_heads=4, head_dim=32, num_key_value_heads=2,
                        intermediate_size=384, num_hidden_layers=4)


def rate(estimate: torch.Tensor, sizes: torch.Tensor, cost: StepCost, run_rows: torch.Tensor) -> float:
    """Expected committed tokens per second of a step whose windows have ``sizes``."""
    rows = run_rows.double().sum() + sizes.sum()
    return float(expected_commits(estimate, sizes).sum() / cost(rows))


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_the_best_of_every_choice(seed):
    rng = random.Random(seed)
    batch, max_window = rng.randint(1, 3), rng.randint(1, 5)
    estimate = torch.tensor([rng.choice([0.4, 1.0, rng.uniform(0.5, 9.0), 12.0]) for _ in range(batch)])
    cost = StepCost(fixed=rng.uniform(0.5, 2.0), per_row=rng.choice([0.0, 0.01, 0.1, 1.0]),
                    knee=rng.choice([0, 2, 6, 20]))
    run_rows = estimate.clamp(0, max_window)
    chosen = choose_window_sizes(estimate, max_window, cost)
    assert chosen.dtype == torch.int64 and chosen.shape == (batch,)
    assert ((1 <= chosen) & (chosen <= max_window)).all()
    every = {sizes: rate(estimate, torch.tensor(sizes), cost, run_rows)
             for sizes in itertools.product(range(1, max_window + 1), repeat=batch)}
    best = max(every.values())
    got = rate(estimate, chosen, cost, run_rows)
    assert got == pytest.approx(best, rel=1e-12), (estimate, cost, chosen, max(every, key=every.get))
    # Of the best choices, it forwards the fewest rows.
    assert int(chosen.sum()) == min(sum(s) for s, r in every.items() if r == pytest.approx(best, rel=1e-12))


def test_slot_gains_follow_the_estimate():
    gains = slot_gains(torch.tensor([0.5, 1.0, 2.0, 16.0]), 4)
    assert gains[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]  # the first slot always commits
    assert gains[0, 1:].tolist() == gains[1, 1:].tolist() == [0.0, 0.0, 0.0]  # at most one per forward
    assert gains[2].tolist() == [1.0, 0.5, 0.25, 0.125]
    assert (gains[3, 1:] < gains[3, :-1]).all() and gains[3, 3] > 0.8
    # A geometric run of mean m commits about m with an unbounded window.
    assert float(slot_gains(torch.tensor([3.0]), 200).sum()) == pytest.approx(3.0)


def test_uncertain_text_gets_one_slot_and_predictable_text_the_whole_window():
    host_bound = step_cost(MICRO)
    assert host_bound.per_row * 4096 < 0.01 * host_bound.fixed  # rows cost next to nothing
    sizes = choose_window_sizes(torch.tensor([0.8, 1.0, 16.5, 40.0]), 16, host_bound)
    assert sizes.tolist() == [1, 1, 16, 16]
    # In between: as many slots as are expected to commit at least MIN_SLOT_GAIN tokens.
    (two,) = choose_window_sizes(torch.tensor([2.0]), 16, host_bound).tolist()
    assert 0.5 ** (two - 1) >= MIN_SLOT_GAIN > 0.5 ** two


def test_a_compute_bound_batch_gets_smaller_windows_than_a_host_bound_one():
    """On the Qwen3-8B shape a batch of 64 windows is past the knee (a row costs its FLOPs) where
    one window is not; on micro no batch is."""
    estimate = torch.full((64,), 6.0)
    alone = choose_window_sizes(estimate[:1], 16, step_cost(QWEN3_8B))
    batch = choose_window_sizes(estimate, 16, step_cost(QWEN3_8B))
    host_bound = choose_window_sizes(estimate, 16, step_cost(MICRO))
    assert int(alone) == int(host_bound[0]) > 8
    assert batch.float().mean() < 0.5 * float(alone)
    assert (host_bound == host_bound[0]).all()
    # The knee can be moved (--wedlm-window-tokens): with none, every row of the batch costs.
    no_knee = choose_window_sizes(estimate, 16, step_cost(QWEN3_8B, knee=0))
    assert no_knee.sum() <= batch.sum()


def test_the_estimate_follows_what_windows_commit():
    """A request that commits one token per forward at W 16 drifts to W 1; at W 1 (which always
    commits its one slot, a censored count) it probes W 2 and more again; one that commits its whole
    window keeps growing past it."""
    cost = step_cost(MICRO)
    estimate = torch.tensor([16.0])
    for _ in range(20):
        estimate = update_commit_estimate(estimate, torch.tensor([1]), torch.tensor([16]))
    assert float(estimate) < 1.1 and int(choose_window_sizes(estimate, 16, cost)) == 1
    sizes = []
    for _ in range(12):
        window = choose_window_sizes(estimate, 16, cost)
        sizes.append(int(window))
        estimate = update_commit_estimate(estimate, torch.ones(1, dtype=torch.long), window)  # commits 1
    assert min(sizes) == 1 and max(sizes) >= 2  # back and forth: the probe
    assert float(estimate) < 2
    full = torch.tensor([4.0])
    for _ in range(20):
        window = choose_window_sizes(full, 16, cost)
        full = update_commit_estimate(full, window, window)  # commits every slot
    assert int(choose_window_sizes(full, 16, cost)) == 16


def test_an_empty_batch_and_a_window_of_one():
    cost = step_cost(MICRO)
    assert choose_window_sizes(torch.zeros(0), 16, cost).tolist() == []
    assert choose_window_sizes(torch.tensor([9.0, 0.5]), 1, cost).tolist() == [1, 1]


@pytest.mark.parametrize("seed", range(10))
def test_the_short_cuts_give_the_best_prefix(seed):
    """Where every usable slot pays (every window whole below the knee, or rows next to free on a
    host-bound model's cost curve), the short cut gives the best prefix's answer (the sort): every
    slot expected to commit at least MIN_SLOT_GAIN. And a curve whose rows cost takes the sort."""
    gen = torch.Generator().manual_seed(seed)
    batch = [8, 64][seed % 2]
    estimate = torch.rand(batch, generator=gen) * 20
    run_rows = estimate.clamp(0, 16)
    below = StepCost(fixed=1.0, per_row=1.0, knee=10**6)
    host_bound = step_cost(MICRO)
    compute_bound = step_cost(QWEN3_8B)
    assert every_usable_slot_pays(below, batch, 16, float(run_rows.sum()))
    assert every_usable_slot_pays(host_bound, batch, 16, float(run_rows.sum()))
    assert not every_usable_slot_pays(compute_bound, batch, 16, float(run_rows.sum()))
    for cost in (below, host_bound, StepCost(fixed=1.0, per_row=0.0, knee=0)):
        assert (choose_window_sizes(estimate, 16, cost).tolist()
                == best_prefix_sizes(estimate, 16, cost, run_rows).tolist()
                == (slot_gains(estimate, 16) >= MIN_SLOT_GAIN).sum(1).tolist())
    # Just inside the bound: a slot of the least usable gain still raises the rate.
    edge = StepCost(fixed=1.0, per_row=MIN_SLOT_GAIN / (2 * batch * 16) * 0.999, knee=0)
    assert every_usable_slot_pays(edge, batch, 16, 0.0)
    assert choose_window_sizes(estimate, 16, edge).tolist() == best_prefix_sizes(estimate, 16, edge, run_rows).tolist()


def test_a_new_request_starts_from_what_the_server_saw():
    """The scheduler's record (adapter/window_sizer.py): requests whose windows commit one token per
    forward bring the server's estimate down, so a new request's first window is small; one that
    finished is forgotten."""
    from vllm_wedlm.adapter.window_sizer import WINDOW_SIZES_ATTR, WindowSizer

    sizer = WindowSizer(16, step_cost(MICRO))
    first = SimpleNamespace()
    assert sizer.assign(first, ["a", "b"]) == {"a": 16, "b": 16} == getattr(first, WINDOW_SIZES_ATTR)
    for _ in range(60):
        step = SimpleNamespace()
        sizes = sizer.assign(step, ["a", "b"])
        sizer.observe(step, {"a": 1, "b": 1})
    assert max(sizes.values()) <= 2, sizes
    assert sizer.assign(SimpleNamespace(), ["new"])["new"] <= 3
    sizer.forget("a")
    assert "a" not in sizer.estimates and sizer.window_of("a") == 16


def test_one_token_per_forward_stays_at_one_slot_where_rows_cost():
    """A window of one slot always commits it, so its full forward counts only SINGLE_SLOT_BONUS
    more: requests that commit one token per forward (random weights) settle at W 1 on the Qwen3-8B
    shape's batch of 64, where each row costs its FLOPs, and still probe W 2 alone, where rows are
    free. With the full bonus they alternated W 1 and 2 at batch 64 (the H200's 0.62x AR)."""
    cost = step_cost(QWEN3_8B)
    for batch, most_at_two in ((64, 0.0), (1, 1.0)):
        estimate, at_two = torch.ones(batch), 0
        for _ in range(100):
            window = choose_window_sizes(estimate, 16, cost)
            at_two += int((window == 2).sum())
            assert int(window.max()) <= 2
            estimate = update_commit_estimate(estimate, torch.ones(batch, dtype=torch.long), window)
        share = at_two / (100 * batch)
        assert share <= most_at_two and (share > 0.2 if batch == 1 else share == 0), (batch, share)
    one_slot = update_commit_estimate(torch.tensor([1.0]), torch.tensor([1]), torch.tensor([1]))
    two_slots = update_commit_estimate(torch.tensor([1.0]), torch.tensor([2]), torch.tensor([2]))
    assert float(one_slot) == pytest.approx(1 + COMMIT_AVERAGE_WEIGHT * SINGLE_SLOT_BONUS)
    assert float(two_slots) == pytest.approx(1 + COMMIT_AVERAGE_WEIGHT * (1 + CENSORED_BONUS))
    assert update_commit_estimate(1.0, 1, 1) == pytest.approx(float(one_slot))  # the scheduler's scalars


@pytest.mark.parametrize("seed", range(30))
def test_the_step_chosen_is_the_best_of_every_choice_and_an_ar_step(seed):
    """``choose_step``: the windows' best choice, or W 0 throughout (an AR step, one token per
    request), whichever commits more tokens per second."""
    rng = random.Random(seed)
    batch, max_window = rng.randint(1, 3), rng.randint(1, 4)
    estimate = torch.tensor([rng.choice([0.6, 1.0, 1.2, rng.uniform(0.5, 9.0)]) for _ in range(batch)])
    cost = StepCost(fixed=rng.uniform(0.5, 2.0), per_row=rng.choice([0.0, 0.01, 0.1]), knee=rng.choice([0, 2, 6]))
    ar_step = cost.fixed * rng.uniform(0.3, 1.5)
    run_rows = estimate.clamp(0, max_window)
    chosen = choose_step(estimate, max_window, cost, ar_step)
    assert chosen.dtype == torch.int64 and chosen.shape == (batch,)
    ar_rate = batch / ar_step
    best = max([ar_rate] + [rate(estimate, torch.tensor(sizes), cost, run_rows)
                            for sizes in itertools.product(range(1, max_window + 1), repeat=batch)])
    if (chosen == 0).all():
        assert ar_rate == pytest.approx(best, rel=1e-9)
    else:
        assert ((1 <= chosen) & (chosen <= max_window)).all()
        assert rate(estimate, chosen, cost, run_rows) == pytest.approx(best, rel=1e-9)


def test_uncertain_text_falls_to_ar_steps_where_they_are_cheaper_and_predictable_text_keeps_windows():
    """On the micro's host-bound curve, with an AR step 0.8 of a window step's fixed cost (the
    plugin's host work): windows committing one token per forward lose to AR, windows committing
    six win; where an AR step costs as much as a window step, even one token per forward keeps the
    windows at W 1 (the same token, and the estimate that lets W grow again)."""
    cost = step_cost(MICRO, 256)
    uncertain, predictable = torch.full((8,), 1.0), torch.full((8,), 6.0)
    assert (choose_step(uncertain, 16, cost, 0.8 * cost.fixed) == 0).all()
    assert (choose_step(predictable, 16, cost, 0.8 * cost.fixed) > 1).all()
    assert (choose_step(uncertain, 16, cost, 1.2 * cost.fixed) >= 1).all()
    assert choose_step(torch.zeros(0), 16, cost, 1.0).shape == (0,)


@pytest.mark.parametrize("seed", range(30))
def test_the_host_choice_is_choose_step(seed):
    """``choose_step_on_host`` (the scheduler's every step, Python numbers) gives ``choose_step``'s
    answer wherever every usable slot pays, and declines elsewhere."""
    rng = random.Random(seed)
    batch = rng.randint(1, 64)
    estimates = [rng.choice([0.5, 1.0, 1.05, rng.uniform(0.5, 16.0), 14.0]) for _ in range(batch)]
    host_bound = step_cost(MICRO)
    ar_step = host_bound.fixed * rng.uniform(0.3, 1.5)
    chosen = choose_step_on_host(estimates, 16, host_bound, ar_step)
    assert chosen == choose_step(torch.tensor(estimates), 16, host_bound, ar_step).tolist()
    compute_bound = step_cost(QWEN3_8B)
    if not every_usable_slot_pays(compute_bound, batch, 16, sum(min(e, 16) for e in estimates)):
        assert choose_step_on_host(estimates, 16, compute_bound, ar_step) is None


def test_ar_steps_probe_windows_and_come_back():
    """The scheduler's record (adapter/window_sizer.py): requests that commit one token per forward
    step AR (W 0), with two window steps every 4, 8, 16 ... AR steps (a probe: at least 4 slots, its
    commits observed); once windows commit again, they stay. The AR step's cost is timed
    (``StepTimes``) unless fixed; "off" never steps AR."""
    from vllm_wedlm.adapter.window_sizer import (
        PROBE_GAP,
        PROBE_STEPS,
        PROBE_WINDOW,
        WINDOW_SIZES_ATTR,
        WindowSizer,
    )

    requests = ["a", "b"]
    sizer = WindowSizer(16, step_cost(MICRO), ar_steps=True, ar_step_cost=0.5)
    sizer.estimates.update(a=1.0, b=1.0)
    kinds = []
    for _ in range(3 * PROBE_GAP + 2 * PROBE_STEPS):
        step = SimpleNamespace()
        ar = sizer.steps_ar(requests)
        chosen = sizer.assign(step, [] if ar else requests, requests if ar else [])
        kinds.append("ar" if ar else "probe")
        assert getattr(step, WINDOW_SIZES_ATTR) == chosen
        assert set(chosen.values()) == ({0} if ar else {PROBE_WINDOW})
        assert sizer.holds_window("a") == (not ar)
        if not ar:
            sizer.observe(step, {"a": 1, "b": 1})
    assert kinds == ["ar"] * PROBE_GAP + ["probe"] * PROBE_STEPS + ["ar"] * 2 * PROBE_GAP + ["probe"] * PROBE_STEPS
    for _ in range(3):  # the text turns predictable: the probe's windows fill up
        sizer.observe(SimpleNamespace(**{"wedlm_forwarded_window_sizes": {"a": 16, "b": 16}}), {"a": 16, "b": 16})
    assert not sizer.steps_ar(requests) and not sizer.steps_ar(requests)

    for ar_seconds, steps_ar in ((0.004, True), (0.009, False)):
        # Window steps of 10 ms: 1.5 tokens a window pay for 2.5x an AR step's time, not for 1.1x.
        timed = WindowSizer(16, step_cost(MICRO), ar_steps=True)
        timed.estimates.update(a=1.5, b=1.5)
        timed.times.record(2, 0.010, 6)
        timed.times.record(2, ar_seconds, None)
        assert timed.steps_ar(requests) == steps_ar
    off = WindowSizer(16, step_cost(MICRO), ar_steps=False)
    off.estimates.update(a=0.5, b=0.5)
    assert not off.steps_ar(requests)
