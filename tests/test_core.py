"""core/: the WeDLM step on small hand-checked cases (wedlm.md section 2)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from vllm_wedlm.core import WeDLMParams, Window, finish_step, plan_step
from vllm_wedlm.core.sampling import SamplingBatch, SamplingSpec, sample
from vllm_wedlm.core.selection import choose_fills, row_entropy

pytestmark = pytest.mark.fast  # the fast tier: `pytest -m fast` (README)

M = 99  # mask id in these cases


def window(spec: str) -> Window:
    """'A.C.' -> slots A, mask, C, mask (letters become ids 1, 2, ...)."""
    tokens = [M if c == "." else ord(c) - ord("A") + 1 for c in spec]
    return Window(torch.tensor(tokens), torch.tensor([c != "." for c in spec]))


def test_topological_order_keeps_logical_positions():
    # The spec's example: slots [A, M, C, M] at positions n..n+3 are fed as [A, C, M, M]
    # with positions [n, n+2, n+1, n+3].
    plan = plan_step(window("A.C."), window_size=4, committed_len=10, limit=100, mask_id=M)
    assert plan.num_commit == 1
    # One committed slot means one mask appended: 5 slots, [A, M, C, M, M].
    assert plan.window.tokens.tolist() == [1, M, 3, M, M]
    assert plan.order.tolist() == [0, 2, 1, 3, 4]
    assert plan.input_ids.tolist() == [1, 3, M, M, M]
    assert (10 + plan.order).tolist() == [10, 12, 11, 13, 14]
    assert plan.num_masks == 3
    assert plan.committed.tolist() == [1]


def test_first_step_is_all_masks_and_commits_nothing():
    plan = plan_step(None, window_size=4, committed_len=7, limit=100, mask_id=M)
    assert plan.input_ids.tolist() == [M] * 4 and plan.num_commit == 0 and plan.num_masks == 4


def test_window_never_reaches_the_limit():
    assert len(plan_step(None, 16, committed_len=7, limit=10, mask_id=M).window) == 3
    assert len(plan_step(None, 16, committed_len=7, limit=None, mask_id=M).window) == 16  # no KV end
    # Two leading filled slots commit, but only one new slot fits before the limit.
    plan = plan_step(window("AB."), 3, committed_len=7, limit=11, mask_id=M)
    assert plan.num_commit == 2 and len(plan.window) == 4


def test_leading_filled_stops_at_the_first_mask():
    assert window("AB.C").leading_filled() == 2
    assert window(".ABC").leading_filled() == 0
    assert window("ABC").leading_filled() == 3


def test_threshold_is_strict_and_distance_counts_filled_slots():
    slots = torch.tensor([1, 3, 4])  # masks at slots 1, 3, 4 (slot 2 filled)
    entropy = torch.tensor([0.5, 0.3, 0.1])
    # lambda 0.1: adjusted = [0.5, 0.3 + 0.2, 0.1 + 0.3] = [0.5, 0.5, 0.4]
    chosen = choose_fills(entropy, slots, WeDLMParams(entropy_threshold=0.5, pos_penalty=0.1))
    assert chosen.tolist() == [False, False, True]
    chosen = choose_fills(entropy, slots, WeDLMParams(entropy_threshold=0.51, pos_penalty=0.1))
    assert chosen.tolist() == [True, True, True]


def test_argmin_when_nothing_is_under_the_threshold_or_threshold_is_none():
    slots = torch.tensor([0, 1, 2])
    entropy = torch.tensor([2.0, 1.0, 3.0])
    for tau in (0.4, None):
        chosen = choose_fills(entropy, slots, WeDLMParams(entropy_threshold=tau, pos_penalty=0.0))
        assert chosen.tolist() == [False, True, False]  # not necessarily the leftmost mask
    # With a large penalty the leftmost wins; ties go to the first.
    chosen = choose_fills(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), WeDLMParams(None, pos_penalty=1.0))
    assert chosen.tolist() == [True, False]


def test_finish_step_commits_then_fills_own_rows():
    plan = plan_step(window("A.C."), 4, committed_len=0, limit=100, mask_id=M)
    # Mask rows in physical order are slots 1, 3, 4 of [A, M, C, M, M]; after committing A they
    # are slots 0, 2, 3 of [M, C, M, M].
    entropy = torch.tensor([0.1, 5.0, 0.2])
    tokens = torch.tensor([20, 21, 22])
    nxt = finish_step(plan, entropy, tokens, WeDLMParams(entropy_threshold=0.4, pos_penalty=0.0))
    assert nxt.tokens.tolist() == [20, 3, M, 22]
    assert nxt.filled.tolist() == [True, True, False, True]
    assert nxt.leading_filled() == 2  # the next step commits 20 and C


def test_row_entropy():
    uniform = torch.zeros(2, 8)
    assert torch.allclose(row_entropy(uniform), torch.full((2,), math.log(8)))
    peaked = torch.tensor([[0.0, -float("inf"), -float("inf")], [100.0, 0.0, 0.0]])
    assert torch.allclose(row_entropy(peaked), torch.zeros(2), atol=1e-6)
    assert row_entropy(torch.zeros(1, 4, dtype=torch.bfloat16)).dtype == torch.float32


def sample_rows(logits, specs, rows_per_spec, mask_id):
    return sample(logits, SamplingBatch.of(specs, rows_per_spec), mask_id)


def test_sampling_greedy_bans_the_mask_and_respects_settings():
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0], [3.0, 0.0, 0.0, 9.0]])
    # Row 1's best is the mask id (3): never drawn.
    assert sample_rows(logits, [SamplingSpec()], [2], mask_id=3).tolist() == [2, 0]
    # top_k 1 and a tiny top_p leave only the best token whatever the temperature.
    for spec in (SamplingSpec(temperature=5.0, top_k=1), SamplingSpec(temperature=5.0, top_p=1e-6)):
        assert sample_rows(logits, [spec], [2], mask_id=3).tolist() == [2, 0]
    # Seeded draws repeat; rows of different requests use their own settings.
    wide = torch.zeros(6, 50)
    draws = [sample_rows(wide, [SamplingSpec(1.0, generator=torch.Generator().manual_seed(7)), SamplingSpec()],
                         [3, 3], mask_id=49).tolist() for _ in range(2)]
    assert draws[0] == draws[1]
    assert draws[0][3:] == [0, 0, 0] and len(set(draws[0][:3])) > 1


@pytest.mark.parametrize("bad", [{"entropy_threshold": 0}, {"entropy_threshold": -1.0},
                                 {"entropy_threshold": float("nan")}, {"pos_penalty": -0.1},
                                 {"pos_penalty": float("inf")}, {"entropy_threshold": "0.4"},
                                 {"lossless": 1}, {"lossless": "true"}])
def test_invalid_knobs(bad):
    with pytest.raises(ValueError):
        WeDLMParams(**bad)


def test_core_never_imports_vllm():
    core = Path(__file__).resolve().parents[1] / "vllm_wedlm" / "core"
    for path in core.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "vllm" or n.startswith("vllm.") for n in names), path
