"""The adaptive window's choice of W (``core/window_policy.py``), in Python numbers.

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

from vllm_wedlm.adapter.async_gate import step_cost
from vllm_wedlm.core.window_policy import (
    CENSORED_REACH,
    MIN_SLOT_GAIN,
    REACH_WEIGHT,
    SINGLE_SLOT_REACH,
    StepCost,
    best_prefix,
    choose_step,
    choose_window_sizes,
    every_usable_slot_pays,
    expected_commits,
    expected_run,
    full_reach,
    update_reach,
    usable_gains,
    zero_windows,
)

pytestmark = pytest.mark.fast

#: The Qwen3-8B shape's layers (its config's sizes), for its cost curve.
QWEN3_8B = SimpleNamespace(hidden_size=4096, num_attention_heads=32, head_dim=128, num_key_value_heads=8,
                           intermediate_size=12288, num_hidden_layers=36)
#: A model whose forward costs next to nothing beside the host's work (the shipped micro's shape).
MICRO = SimpleNamespace(hidden_size=128, num_attention_heads=4, head_dim=32, num_key_value_heads=2,
                        intermediate_size=384, num_hidden_layers=4)


def reach_after(history: list[tuple[int, int]], max_window: int) -> list[float]:
    """The reach of a request whose forwards committed ``history`` (committed, W), from nothing known."""
    reach = full_reach(max_window)
    for committed, window_size in history:
        reach = update_reach(reach, committed, window_size)
    return reach


def random_history(rng: random.Random, max_window: int) -> list[tuple[int, int]]:
    """A synthetic commit history: windows of random W committing a run drawn from one of a few
    kinds of text (uncertain, predictable, swinging between the two, anything)."""
    kind = rng.choice(["uncertain", "predictable", "swinging", "any"])
    history = []
    for _ in range(rng.randint(0, 12)):
        window_size = rng.randint(1, max_window)
        run = {"uncertain": rng.choice([0, 1, 1, 1]), "predictable": window_size,
               "swinging": rng.choice([1, 1, 1, window_size]), "any": rng.randint(0, window_size)}[kind]
        history.append((min(run, window_size), window_size))
    return history


def reaches(rng: random.Random, batch: int, max_window: int) -> list[list[float]]:
    """The reaches of ``batch`` requests of random histories."""
    return [reach_after(random_history(rng, max_window), max_window) for _ in range(batch)]


def rate(reach: list[list[float]], sizes, cost: StepCost, run_rows: float) -> float:
    """Expected committed tokens per second of a step whose windows have ``sizes``."""
    return expected_commits(reach, list(sizes)) / cost.seconds(run_rows + sum(sizes))


def usable_slots(reach: list[list[float]]) -> list[int]:
    """Each window's slots expected to commit at least MIN_SLOT_GAIN (the first always)."""
    return [1 + sum(gain >= MIN_SLOT_GAIN for gain in r[1:]) for r in reach]


def small_batch(rng: random.Random) -> tuple[list[list[float]], StepCost, int, int]:
    """A batch of 1-3 requests of random histories, windows of at most 1-5 slots, and a random cost
    curve (host-bound, with a knee, compute-bound): reaches, cost, batch size, largest window."""
    batch, max_window = rng.randint(1, 3), rng.randint(1, 5)
    cost = StepCost(fixed=rng.uniform(0.5, 2.0), per_row=rng.choice([0.0, 0.01, 0.1, 1.0]),
                    knee=rng.choice([0, 2, 6, 20]))
    return reaches(rng, batch, max_window), cost, batch, max_window


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_the_best_of_every_choice(seed):
    reach, cost, batch, max_window = small_batch(random.Random(seed))
    run_rows = expected_run(reach)
    chosen = choose_window_sizes(reach, cost)
    assert len(chosen) == batch and all(isinstance(w, int) and 1 <= w <= max_window for w in chosen)
    every = {sizes: rate(reach, sizes, cost, run_rows)
             for sizes in itertools.product(range(1, max_window + 1), repeat=batch)}
    best = max(every.values())
    got = rate(reach, chosen, cost, run_rows)
    assert got == pytest.approx(best, rel=1e-12), (reach, cost, chosen, max(every, key=every.get))
    # Of the best choices, it forwards the fewest rows.
    assert sum(chosen) == min(sum(s) for s, r in every.items() if r == pytest.approx(best, rel=1e-12))


@pytest.mark.parametrize("seed", range(10))
def test_the_reach_is_the_share_of_runs_that_reached_each_slot(seed):
    """Without censoring (no window filled), the reach is each slot's share of recent runs that got
    past it, weighted as the moving average weighs them; it never rises along the window."""
    rng = random.Random(seed)
    history = [(rng.randint(0, 7), 8) for _ in range(rng.randint(1, 30))]
    reach = reach_after(history, 8)
    weights = [REACH_WEIGHT * (1 - REACH_WEIGHT) ** age for age in range(len(history))][::-1]
    start = (1 - REACH_WEIGHT) ** len(history)  # what is left of the first guess (every slot reached)
    for k in range(8):
        share = start + sum(w for w, (run, _) in zip(weights, history, strict=True) if run > k)
        assert reach[k] == pytest.approx(share)
    assert all(a >= b for a, b in zip(reach, reach[1:], strict=False))
    for history in ([(16, 16)], [(3, 16), (4, 4), (4, 4)], [(1, 1)] * 5):
        reach = reach_after(history, 16)
        assert all(a >= b for a, b in zip(reach, reach[1:], strict=False)), reach


def test_a_full_window_counts_the_slots_past_it_as_reached_by_chance():
    """A run that filled its window says nothing of the slots past it: slot j past the end counts
    CENSORED_REACH ** j reached (SINGLE_SLOT_REACH ** j past a window of one slot, which always
    commits); a run that stopped short counts every slot past it unreached."""
    fresh = [0.0] * 8
    assert update_reach(fresh, 4, 4) == pytest.approx(
        [REACH_WEIGHT] * 4 + [REACH_WEIGHT * CENSORED_REACH ** j for j in range(1, 5)])
    assert update_reach(fresh, 1, 1) == pytest.approx(
        [REACH_WEIGHT] + [REACH_WEIGHT * SINGLE_SLOT_REACH ** j for j in range(1, 8)])
    assert update_reach(fresh, 3, 4) == pytest.approx([REACH_WEIGHT] * 3 + [0.0] * 5)
    assert update_reach(fresh, 0, 4) == [0.0] * 8  # a plain window that committed nothing


def test_runs_that_swing_keep_the_whole_window():
    """Counting ("B, C, D, ..."): runs of one token three forwards of four, the whole window the
    fourth. Every deep slot keeps about the share of long runs, so the window stays whole on a
    host-bound model; the expected commit of W 16 beats that of the W a geometric run of the same
    mean would get."""
    host_bound = step_cost(MICRO)
    history = [(1, 16), (1, 16), (1, 16), (16, 16)] * 6 + [(1, 16)] * 3
    reach = [reach_after(history, 16)]
    assert reach[0][15] > 0.1  # the last long run three forwards ago
    (size,) = choose_window_sizes(reach, host_bound)
    assert size == 16
    mean = expected_run(reach)
    geometric = sum((1 - 1 / mean) ** w >= MIN_SLOT_GAIN for w in range(16))
    assert geometric < 12
    whole, cut = (expected_commits(reach, [w]) for w in (16, geometric))
    assert whole > cut


def test_uncertain_text_gets_one_slot_and_predictable_text_the_whole_window():
    host_bound = step_cost(MICRO)
    assert host_bound.per_row * 4096 < 0.01 * host_bound.fixed  # rows cost next to nothing
    uncertain = reach_after([(1, 16)] * 20, 16)
    nothing = reach_after([(0, 16), (1, 16)] * 10, 16)
    predictable = reach_after([(16, 16)] * 3, 16)
    sizes = choose_window_sizes([uncertain, nothing, predictable, full_reach(16)], host_bound)
    assert sizes == [1, 1, 16, 16]
    # In between: as many slots as are expected to commit at least MIN_SLOT_GAIN tokens.
    halfway = reach_after([(8, 16)] * 20, 16)
    assert choose_window_sizes([halfway], host_bound) == [8]


def test_a_compute_bound_batch_gets_smaller_windows_than_a_host_bound_one():
    """On the Qwen3-8B shape a batch of 64 windows is past the knee (a row costs its FLOPs) where
    one window is not; on micro no batch is."""
    reach = [reach_after([(16, 16), (4, 16), (9, 16), (2, 16)] * 3, 16)] * 64
    (alone,) = choose_window_sizes(reach[:1], step_cost(QWEN3_8B))
    batch = choose_window_sizes(reach, step_cost(QWEN3_8B))
    host_bound = choose_window_sizes(reach, step_cost(MICRO))
    assert alone == host_bound[0] == 16
    assert sum(batch) / len(batch) < 0.6 * alone
    assert set(host_bound) == {16}
    # The knee can be moved (--wedlm-window-tokens): with none, every row of the batch costs.
    no_knee = choose_window_sizes(reach, step_cost(QWEN3_8B, knee=0))
    assert sum(no_knee) <= sum(batch)


def test_the_reach_follows_what_windows_commit():
    """A request that commits one token per forward at W 16 drifts to W 1; at W 1 (which always
    commits its one slot, a censored count) it probes W 2 again; one that commits its whole window
    keeps growing past it."""
    cost = step_cost(MICRO)
    reach = reach_after([(1, 16)] * 20, 16)
    assert sum(reach) < 1.1 and choose_window_sizes([reach], cost) == [1]
    sizes = []
    for _ in range(12):
        (window,) = choose_window_sizes([reach], cost)
        sizes.append(window)
        reach = update_reach(reach, 1, window)  # commits 1
    assert min(sizes) == 1 and max(sizes) == 2  # back and forth: the probe
    sizes = []
    for _ in range(10):  # the text turns predictable: every window fills (two slots more each)
        (window,) = choose_window_sizes([reach], cost)
        sizes.append(window)
        reach = update_reach(reach, window, window)
    assert sizes == sorted(sizes) and sizes[-2:] == [16, 16], sizes


def test_an_empty_batch_and_a_window_of_one():
    cost = step_cost(MICRO)
    assert choose_window_sizes([], cost) == [] and choose_step([], cost, 1.0) == []
    assert choose_window_sizes([[1.0], [0.5]], cost) == [1, 1]


@pytest.mark.parametrize("seed", range(10))
def test_the_short_cut_gives_the_best_prefix(seed):
    """Where every usable slot pays (every window whole below the knee, or rows next to free on a
    host-bound model's cost curve), the short cut gives the search's answer: every slot expected to
    commit at least MIN_SLOT_GAIN. And a curve whose rows cost takes the search."""
    rng = random.Random(seed)
    batch = [8, 64][seed % 2]
    reach = reaches(rng, batch, 16)
    run_rows = expected_run(reach)
    gains = [usable_gains(r) for r in reach]
    below = StepCost(fixed=1.0, per_row=1.0, knee=10**6)
    host_bound = step_cost(MICRO)
    compute_bound = step_cost(QWEN3_8B)
    assert every_usable_slot_pays(below, batch, 16, run_rows)
    assert every_usable_slot_pays(host_bound, batch, 16, run_rows)
    assert not every_usable_slot_pays(compute_bound, batch, 16, run_rows)
    for cost in (below, host_bound, StepCost(fixed=1.0, per_row=0.0, knee=0)):
        assert choose_window_sizes(reach, cost) == best_prefix(gains, cost, run_rows)[0] == usable_slots(reach)
    # Just inside the bound: a slot of the least usable gain still raises the rate.
    edge = StepCost(fixed=1.0, per_row=MIN_SLOT_GAIN / (2 * batch * 16) * 0.999, knee=0)
    assert every_usable_slot_pays(edge, batch, 16, 0.0)
    assert choose_window_sizes(reach, edge) == best_prefix(gains, edge, run_rows)[0]


@pytest.mark.parametrize("seed", range(30))
def test_the_search_stops_at_the_best_prefix(seed):
    """``best_prefix`` stops at the first slot that lowers the rate: the rate of every prefix of the
    slots in order of gain has one peak (gains falling, cost convex). Checked against the best of
    every prefix on batches too large to try every choice, where rows cost."""
    rng = random.Random(seed)
    batch = rng.randint(1, 128)
    reach = reaches(rng, batch, 16)
    run_rows = expected_run(reach)
    cost = rng.choice([step_cost(QWEN3_8B), step_cost(QWEN3_8B, knee=0),
                       StepCost(fixed=1.0, per_row=rng.uniform(1e-4, 0.1), knee=rng.choice([0, 64, 512]))])
    gains = [usable_gains(r) for r in reach]
    extra = sorted((g for usable in gains for g in usable[1:]), reverse=True)
    base = sum(usable[0] for usable in gains)
    prefixes = [(base + sum(extra[:n])) / cost.seconds(run_rows + batch + n) for n in range(len(extra) + 1)]
    best = max(prefixes)
    sizes, commits, rows = best_prefix(gains, cost, run_rows)
    assert rows == run_rows + sum(sizes) and commits == pytest.approx(expected_commits(reach, sizes))
    assert commits / cost.seconds(rows) == pytest.approx(best, rel=1e-12)
    assert sum(sizes) - batch == min(n for n, r in enumerate(prefixes) if r == pytest.approx(best, rel=1e-12))
    assert choose_window_sizes(reach, cost) == sizes


def test_a_new_request_starts_from_what_the_server_saw():
    """The scheduler's record (adapter/window_sizer.py): requests whose windows commit one token per
    forward bring the server's reach down, so a new request's first window is small; one that
    finished is forgotten."""
    from vllm_wedlm.adapter.window_sizer import WindowSizer

    sizer = WindowSizer(16, step_cost(MICRO))
    assert sizer.assign(["a", "b"]) == ({"a": 16, "b": 16}, {"a": 16, "b": 16})
    for _ in range(60):
        sizes, forwarded = sizer.assign(["a", "b"])
        sizer.observe(forwarded, {"a": 1, "b": 1})
    assert max(sizes.values()) <= 2, sizes
    assert sizer.assign(["new"])[0]["new"] <= 3
    sizer.forget("a")
    assert "a" not in sizer.reaches and sizer.window_of("a") == 16


def test_one_token_per_forward_stays_at_one_slot_where_rows_cost():
    """A window of one slot always commits it, so the slot past it counts only SINGLE_SLOT_REACH:
    requests that commit one token per forward (random weights) settle at W 1 on the Qwen3-8B
    shape's batch of 64, where each row costs its FLOPs, and still probe W 2 alone, where rows are
    free. Counted as reached at half chance, they alternated W 1 and 2 at batch 64 (the H200's
    0.62x AR, lab notebook 5.20)."""
    cost = step_cost(QWEN3_8B)
    for batch, most_at_two in ((64, 0.0), (1, 1.0)):
        reach, at_two = [full_reach(16)] * batch, 0
        for _ in range(100):
            window = choose_window_sizes(reach, cost)
            at_two += sum(w == 2 for w in window)
            assert max(window) <= 2 or reach[0][2] >= MIN_SLOT_GAIN  # the first forwards: the full guess fades
            reach = [update_reach(r, 1, w) for r, w in zip(reach, window, strict=True)]
        share = at_two / (100 * batch)
        assert share <= most_at_two and (share > 0.2 if batch == 1 else share == 0), (batch, share)
    assert update_reach([1.0, 0.0], 1, 1) == pytest.approx([1.0, REACH_WEIGHT * SINGLE_SLOT_REACH])
    assert update_reach([1.0, 0.0, 0.0], 2, 2) == pytest.approx([1.0, REACH_WEIGHT, REACH_WEIGHT * CENSORED_REACH])


@pytest.mark.parametrize("seed", range(30))
def test_the_step_chosen_is_the_best_of_every_choice_and_an_ar_step(seed):
    """``choose_step``: the windows' best choice, or W 0 throughout (an AR step, one token per
    request), whichever commits more tokens per second."""
    rng = random.Random(seed)
    batch, max_window = rng.randint(1, 3), rng.randint(1, 4)
    reach = reaches(rng, batch, max_window)
    cost = StepCost(fixed=rng.uniform(0.5, 2.0), per_row=rng.choice([0.0, 0.01, 0.1]), knee=rng.choice([0, 2, 6]))
    ar_step = cost.fixed * rng.uniform(0.3, 1.5)
    run_rows = expected_run(reach)
    chosen = choose_step(reach, cost, ar_step)
    assert len(chosen) == batch
    ar_rate = batch / ar_step
    best = max([ar_rate] + [rate(reach, sizes, cost, run_rows)
                            for sizes in itertools.product(range(1, max_window + 1), repeat=batch)])
    if set(chosen) == {0}:
        assert ar_rate == pytest.approx(best, rel=1e-9)
    else:
        assert all(1 <= w <= max_window for w in chosen)
        assert rate(reach, chosen, cost, run_rows) == pytest.approx(best, rel=1e-9)


def test_uncertain_text_falls_to_ar_steps_where_they_are_cheaper_and_predictable_text_keeps_windows():
    """On the micro's host-bound curve, with an AR step 0.8 of a window step's fixed cost (the
    plugin's host work): windows committing one token per forward lose to AR, windows committing
    six win; where an AR step costs as much as a window step, even one token per forward keeps the
    windows at W 1 (the same token, and the reach that lets W grow again)."""
    cost = step_cost(MICRO, 256)
    uncertain = [reach_after([(1, 16)] * 20, 16)] * 8
    predictable = [reach_after([(6, 16)] * 20, 16)] * 8
    assert set(choose_step(uncertain, cost, 0.8 * cost.fixed)) == {0}
    assert min(choose_step(predictable, cost, 0.8 * cost.fixed)) > 1
    assert min(choose_step(uncertain, cost, 1.2 * cost.fixed)) >= 1


def test_ar_steps_probe_windows_and_come_back():
    """The scheduler's record (adapter/window_sizer.py): requests that commit one token per forward
    step AR (W 0), with two window steps every 4, 8, 16 ... AR steps (a probe: whole windows, their
    commits observed); once windows commit again, they stay. The AR step's cost is timed
    (``StepTimes``) unless fixed; "off" never steps AR."""
    from vllm_wedlm.adapter.window_sizer import PROBE_GAP, PROBE_STEPS, WindowSizer

    requests = ["a", "b"]
    sizer = WindowSizer(16, step_cost(MICRO), ar_steps=True, ar_step_cost=0.5)
    sizer.reaches.update(a=reach_after([(1, 16)] * 20, 16), b=reach_after([(1, 16)] * 20, 16))
    kinds = []
    for _ in range(3 * PROBE_GAP + 2 * PROBE_STEPS):
        ar = sizer.steps_ar(requests)
        chosen, forwarded = sizer.assign([] if ar else requests, requests if ar else [])
        kinds.append("ar" if ar else "probe")
        assert set(chosen.values()) == ({0} if ar else {16})
        assert forwarded == ({} if ar else dict.fromkeys(requests, 16))
        assert sizer.holds_window("a") == (not ar)
        if not ar:
            sizer.observe(forwarded, {"a": 1, "b": 1})
    assert kinds == ["ar"] * PROBE_GAP + ["probe"] * PROBE_STEPS + ["ar"] * 2 * PROBE_GAP + ["probe"] * PROBE_STEPS
    for _ in range(3):  # the text turns predictable: the probe's windows fill up
        sizer.observe({"a": 16, "b": 16}, {"a": 16, "b": 16})
    assert not sizer.steps_ar(requests) and not sizer.steps_ar(requests)

    for ar_seconds, steps_ar in ((0.004, True), (0.009, False)):
        # Window steps of 10 ms: 1.5 tokens a window pay for 2.5x an AR step's time, not for 1.1x.
        timed = WindowSizer(16, step_cost(MICRO), ar_steps=True)
        timed.reaches.update(a=reach_after([(1, 2), (2, 2)] * 10, 16), b=reach_after([(1, 2), (2, 2)] * 10, 16))
        timed.times.record(2, 0.010, 6)
        timed.times.record(2, ar_seconds, None)
        assert timed.steps_ar(requests) == steps_ar
    off = WindowSizer(16, step_cost(MICRO), ar_steps=False)
    off.reaches.update(a=reach_after([(0, 16)] * 20, 16), b=reach_after([(0, 16)] * 20, 16))
    assert not off.steps_ar(requests)


def test_a_probe_of_whole_windows_sees_a_long_run_and_brings_windows_back():
    """Where an AR step costs 0.3 of a window step (lossless windows on ``small`` cost about 2.7 AR
    steps), windows must commit over three tokens a forward to win. A probe forwards whole windows:
    runs of 12 seen by it bring the windows back. The same text seen through windows of 4 (full, so
    only censored past them) would have kept the batch stepping AR (the probes of lab notebook 5.29)."""
    from vllm_wedlm.adapter.window_sizer import PROBE_GAP, PROBE_STEPS, WindowSizer

    def steps(seen_through: int) -> list[int]:
        sizer = WindowSizer(16, step_cost(MICRO), ar_steps=True, ar_step_cost=0.3)
        sizer.reaches.update(a=reach_after([(1, 16)] * 20, 16), b=reach_after([(1, 16)] * 20, 16))
        sizes = []
        for _ in range(PROBE_GAP + PROBE_STEPS + 3):
            ar = sizer.steps_ar(["a", "b"])
            chosen, _ = sizer.assign([] if ar else ["a", "b"], ["a", "b"] if ar else [])
            sizes.append(max(chosen.values()))
            if not ar:
                sizer.observe(dict.fromkeys(chosen, seen_through), dict.fromkeys(chosen, min(12, seen_through)))
        return sizes

    assert steps(16) == [0] * PROBE_GAP + [16] * PROBE_STEPS + [12] * 3
    assert steps(4) == [0] * PROBE_GAP + [16] * PROBE_STEPS + [0] * 3


def zero_rate(reach: list[list[float]], sizes, cost: StepCost, run_rows: float) -> float:
    """``rate`` where a window of W 0 (no mask row) commits exactly one token."""
    commits = sum(1.0 if w == 0 else sum(usable_gains(r)[:w]) for r, w in zip(reach, sizes, strict=True))
    return commits / cost.seconds(run_rows + sum(sizes))


@pytest.mark.parametrize("seed", range(30))
def test_windows_of_w0_only_where_they_commit_as_much_and_the_rate_never_falls(seed):
    """``zero_windows`` (fixed window rows): W 0 for exactly the eligible requests whose chosen window
    is expected to commit at most one token; the batch's expected tokens per second is then at least
    the windows' (a W 0 window commits one token for no mask row)."""
    rng = random.Random(seed)
    reach, cost, batch, _ = small_batch(rng)
    run_rows = expected_run(reach)
    eligible = [rng.random() < 0.7 for _ in range(batch)]
    windows = choose_window_sizes(reach, cost)
    sizes = zero_windows(windows, reach, eligible)
    for r, w, z, ok in zip(reach, windows, sizes, eligible, strict=True):
        assert z == (0 if ok and sum(usable_gains(r)[:w]) <= 1.0 else w), (r, w, ok)
    assert zero_rate(reach, sizes, cost, run_rows) >= rate(reach, windows, cost, run_rows) * (1 - 1e-12)


def test_w0_takes_one_token_per_forward_where_rows_cost_and_keeps_windows_that_fill():
    """On the Qwen3-8B shape's curve at batch 64, requests that commit one token a forward (their
    W 1 windows always commit their slot) fall to W 0; predictable text keeps its windows, and a
    request that may not take W 0 keeps W 1."""
    cost = step_cost(QWEN3_8B)
    uncertain = reach_after([(1, 1)] * 20, 16)
    predictable = reach_after([(16, 16)] * 20, 16)
    reach = [uncertain] * 62 + [predictable, uncertain]
    windows = choose_window_sizes(reach, cost)
    assert windows[:62] == [1] * 62 and windows[62] > 1
    sizes = zero_windows(windows, reach, [True] * 63 + [False])
    assert sizes == [0] * 62 + [windows[62], 1]


def test_w0_windows_probe_on_their_own():
    """The scheduler's record on fixed window rows (``WindowSizer(zero_windows=True)``): a request at
    W 0 plans a whole window after 4, 8, 16 ... windows of W 0 (its own probe, observed as any
    window), in the first step after that whose count is a multiple of ``ZERO_PROBE_PERIOD`` (the
    batch's probes share steps), while a request that may not take W 0 keeps its window; W 0
    forwards do not move the reach (they commit one token whatever the text)."""
    from vllm_wedlm.adapter.window_sizer import PROBE_GAP, ZERO_PROBE_PERIOD, WindowSizer

    assert 2 * PROBE_GAP < ZERO_PROBE_PERIOD  # (so the record below shows the gap doubling)

    sizer = WindowSizer(16, step_cost(QWEN3_8B), zero_windows=True)
    uncertain = reach_after([(1, 1)] * 20, 16)
    names = [f"r{i}" for i in range(64)]
    sizer.reaches.update(dict.fromkeys(names, uncertain))
    seen = []
    for _ in range(3 * ZERO_PROBE_PERIOD + 3):
        chosen, forwarded = sizer.assign(names, zero_ok=set(names[:-1]))
        seen.append(chosen["r0"])
        assert chosen["r63"] == 1  # not eligible: its window
        before = dict(sizer.reaches)
        sizer.observe(forwarded, dict.fromkeys(names, 1))
        assert all(sizer.reaches[n] == before[n] for n in names if forwarded[n] == 0)
        assert any(sizer.reaches[n] != before[n] for n in names if forwarded[n])
    probe = [i for i, w in enumerate(seen) if w == 16]
    # Steps 16 and 32 (after 4 and then 8 W 0 windows); not 48: after the second probe the gap is 16
    # windows, 15 of them by step 48.
    assert set(seen) == {0, 16} and probe == [ZERO_PROBE_PERIOD - 1, 2 * ZERO_PROBE_PERIOD - 1], seen


@pytest.mark.parametrize("batch", [64, 8])
def test_w0_probes_grow_rarer_only_where_their_rows_cost(batch):
    """A request at W 0 doubles the gap between its probes past ``MAX_PROBE_GAP`` only where a
    probe's mask rows cost: on the Qwen3-8B shape's curve at batch 64 (a whole window's 16 rows
    against a request's share of a step of W 0 windows) until its probes take at most
    ``MAX_PROBE_SHARE`` of its time; at batch 8, below the curve's knee, the gap stops at
    ``MAX_PROBE_GAP``. Gaps are counted in steps, each probe waiting for the common clock."""
    from vllm_wedlm.adapter.window_sizer import (
        MAX_PROBE_GAP,
        MAX_PROBE_SHARE,
        MAX_ZERO_PROBE_GAP,
        ZERO_PROBE_PERIOD,
        WindowSizer,
    )

    cost = step_cost(QWEN3_8B)
    sizer = WindowSizer(16, cost, zero_windows=True)
    longest = sizer.longest_zero_gap(batch, batch)  # a step of W 0 windows alone: one row each
    if batch == 64:
        probe = cost.seconds(batch + 16) - cost.seconds(batch)
        assert MAX_PROBE_GAP < longest < MAX_ZERO_PROBE_GAP
        assert probe / longest <= MAX_PROBE_SHARE * cost.seconds(batch) / batch < probe / (longest - 1)
    else:
        assert longest == MAX_PROBE_GAP
    names = [f"r{i}" for i in range(batch)]
    sizer.reaches.update(dict.fromkeys(names, reach_after([(1, 1)] * 20, 16)))
    probes = []
    for step in range(4 * longest + 200):
        chosen, forwarded = sizer.assign(names, zero_ok=set(names))
        if chosen["r0"] == 16:
            probes.append(step)
        sizer.observe(forwarded, dict.fromkeys(names, 1))
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    # Steady: a probe after more than ``longest`` windows of W 0, at the clock's next tick.
    assert max(gaps) == gaps[-1] and longest < gaps[-1] <= longest + 1 + ZERO_PROBE_PERIOD, (longest, gaps)


def test_a_pinned_request_keeps_its_window_through_ar_steps_probes_and_w0():
    """A request that pins its W (``wedlm_window_size``) gets that W for every window the scheduler
    plans (``WindowSizer.pin``): on the synchronous engine no AR step of the batch runs while it does
    (an AR step is W 0 for all), and its batch mates keep their own choice; on fixed window rows it
    never takes W 0 nor a probe's whole window; once it finishes, AR steps come back."""
    from vllm_wedlm.adapter.window_sizer import WindowSizer

    uncertain = reach_after([(1, 16)] * 20, 16)
    sizer = WindowSizer(16, step_cost(MICRO), ar_steps=True, ar_step_cost=0.5)
    sizer.reaches.update(a=uncertain, b=uncertain, c=uncertain)
    assert sizer.steps_ar(["a", "b"])  # uncertain text: AR steps pay
    sizer.pin("c", 8)
    assert sizer.window_of("c") == 8  # its first window, before any plan
    for _ in range(12):
        assert not sizer.steps_ar(["a", "b", "c"])
        chosen, _ = sizer.assign(["a", "b", "c"])
        assert chosen["c"] == 8 and chosen["a"] == chosen["b"] < 8, chosen
        sizer.observe(chosen, dict.fromkeys(chosen, 1))
    sizer.forget("c")
    assert sizer.steps_ar(["a", "b"]) and "c" not in sizer.pinned
    with pytest.raises(ValueError, match="a pinned W must be in \\[1, 16\\], got 17"):
        sizer.pin("d", 17)

    zero = WindowSizer(16, step_cost(QWEN3_8B), zero_windows=True)
    names = [f"r{i}" for i in range(64)]  # (where rows cost: the mates fall to W 0)
    zero.reaches.update(dict.fromkeys(names, reach_after([(1, 1)] * 20, 16)))
    zero.pin("r0", 4)
    seen = []
    for _ in range(3 * 16 + 3):  # W 0 windows and their probes (every ZERO_PROBE_PERIOD steps) for the rest
        seen.append(zero.assign(names, zero_ok=set(names))[0])
    assert all(c["r0"] == 4 for c in seen)
    assert {c["r1"] for c in seen} == {0, 16}  # its mates fall to W 0 and probe
