"""Lossless WeDLM in ``core`` (no engine): the speculative check of a fill, the window update, and
the reference decoder against plain AR decoding of the same weights.

``sampling.verify`` must leave each row's outcome distributed exactly as the row's own (AR)
distribution, whatever the draft: checked with a chi-square test over many independent rows, for
drafts of high, low and zero probability, under temperature, top-k and top-p.
"""

from __future__ import annotations

import pytest
import torch

from chi_square import chi_square_p_value
from conftest import build_checkpoint
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.core.batch import WindowBatch, verification_drafts, verification_rows, verify_windows
from vllm_wedlm.core.sampling import SamplingBatch, SamplingSpec, _distribution, verify
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

pytestmark = pytest.mark.fast  # the fast tier: `pytest -m fast` (README)

VOCAB = 12
MASK = VOCAB - 1
ROWS = 200_000
# A test at this level fails a correct sampler one time in 10,000; the seeds are fixed, so it
# passes or fails the same way on every run.
MIN_P_VALUE = 1e-4


def batch_of(spec: SamplingSpec, rows: int) -> SamplingBatch:
    return SamplingBatch.of([spec], [rows])


def test_greedy_rows_accept_the_argmax_and_otherwise_give_it():
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 1.0, 0.0], [0.0, 0.0, 5.0, 0.0]])
    drafts = torch.tensor([1, 2, -1])
    accepted, tokens = verify(logits, drafts, SamplingBatch(None, None, None, torch.zeros(3, dtype=torch.bool)), 3)
    assert accepted.tolist() == [True, False, False]
    assert tokens.tolist() == [1, 0, 2]


PLAIN = SamplingSpec(temperature=1.0, ban_mask_token=False)
TOP_K = SamplingSpec(temperature=0.7, top_k=4, ban_mask_token=False)
TOP_P = SamplingSpec(temperature=1.3, top_p=0.8, ban_mask_token=False)
# Drafts: the most likely token, the least likely one with mass, one that top-k / top-p removed
# (probability 0: always rejected), and none (the row's last draw after an accepted run).
CASES = [(spec, draft) for spec in (PLAIN, TOP_K, TOP_P) for draft in ("likely", "unlikely", "none")]
CASES += [(TOP_K, "excluded"), (TOP_P, "excluded")]


@pytest.mark.parametrize("spec,draft", CASES, ids=[f"t{s.temperature}-k{s.top_k}-p{s.top_p}-{d}" for s, d in CASES])
def test_a_checked_draft_leaves_the_row_distributed_as_the_ar_distribution(spec, draft):
    torch.manual_seed(0)
    row = torch.randn(VOCAB) * 1.5  # [V]
    logits = row.expand(ROWS, VOCAB)
    batch = batch_of(spec, ROWS)
    _, probs = _distribution(logits[:1], batch_of(spec, 1), MASK)
    p = probs[0].double()  # [V], the AR distribution after top-k / top-p / temperature
    order = torch.argsort(p, descending=True)
    choice = {"likely": int(order[0]), "unlikely": int(order[(p > 0).sum() - 1]),
              "excluded": int(order[-1]), "none": -1}[draft]
    assert draft != "excluded" or p[choice] == 0
    accepted, tokens = verify(logits, torch.full((ROWS,), choice), batch, MASK)
    outcome = torch.where(accepted, torch.tensor(choice), tokens)  # the token each row ends with
    counts = torch.bincount(outcome, minlength=VOCAB).double()
    support = p > 0
    assert counts[~support].sum() == 0, "a token outside the distribution's support came out"
    assert chi_square_p_value(counts[support], p[support] * ROWS) > MIN_P_VALUE
    if choice >= 0:
        rate = accepted.double().mean().item()
        assert abs(rate - p[choice].item()) < 5 * (p[choice].item() * (1 - p[choice].item()) / ROWS) ** 0.5 + 1e-9
    else:
        assert not accepted.any()


def test_verify_windows_commits_the_accepted_run_and_places_the_next_token():
    m = 99
    # Window 0 (lossless): v, d1, d2, d3 | mask, mask; rows check d1 (yes), d2 (no), d3, -.
    # Window 1 (lossless): v, d1 | mask, mask; every check passes: the mask after the run gets the bonus.
    # Window 2 (plain): f, f | mask: commits its leading run, unchanged.
    tokens = torch.tensor([[10, 11, 12, 13, m, m], [20, 21, m, m, m, m], [30, 31, m, m, m, m]])
    filled = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    windows = WindowBatch(tokens, filled, torch.tensor([6, 4, 3]))
    num_rows = verification_rows(windows, torch.tensor([True, True, False]))
    assert num_rows.tolist() == [4, 2, 0]
    assert verification_drafts(tokens, num_rows).tolist() == [11, 12, 13, -1, 21, -1]
    accepted = torch.tensor([True, False, True, False, True, False])
    row_tokens = torch.tensor([0, 42, 0, 0, 0, 43])
    verified, commit = verify_windows(windows, num_rows, accepted, row_tokens, window_size=4, mask_id=m)
    assert commit.tolist() == [2, 2, 2]
    assert verified.tokens.tolist() == [[10, 11, 42, m, m, m], [20, 21, 43, m, m, m], tokens[2].tolist()]
    assert verified.filled.long().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert verified.length.tolist() == [6, 4, 3]
    # A rejection early in a long run cuts the tail past window_size slots after the commit.
    first = WindowBatch(tokens[:1], filled[:1], torch.tensor([6]))
    verified, commit = verify_windows(first, num_rows[:1], torch.tensor([False, True, True, False]),
                                      torch.tensor([7, 0, 0, 0]), window_size=3, mask_id=m)
    assert commit.tolist() == [1]
    assert verified.length.tolist() == [4]
    assert verified.tokens.tolist() == [[10, 7, m, m, m, m]]
    assert verified.filled.long().tolist() == [[1, 1, 0, 0, 0, 0]]


def ar_greedy(model, prompt: list[int], count: int) -> list[int]:
    """Plain greedy next-token decoding with transformers, full recompute each token."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            sequence.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(prompt):]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless-core")
    sharp = {v: build_checkpoint(root, TinySpec(variant=v, logit_scale=30.0)) for v in ("qwen2", "qwen3")}
    return {"qwen2-sharp": sharp["qwen2"], "qwen3-sharp": sharp["qwen3"], "micro": MICRO_CHECKPOINT}


@pytest.mark.parametrize("name", ["qwen2-sharp", "qwen3-sharp", "micro"])
def test_the_lossless_reference_decoder_is_ar_decoding(checkpoints, name):
    path = checkpoints[name]
    model = load_transformers_model(path)
    mask_id = WeDLMConfig.from_pretrained(path).mask_token_id
    prompts = [[5, 17, 33, 40, 2, 9], [3], list(range(20, 60))]
    fewer_forwards = False
    for prompt in prompts:
        expected = ar_greedy(model, prompt, 24)
        for window in (1, 4, 16):
            for tau in (None, 0.4, 1e9):
                out = ReferenceDecoder(model, mask_id, window).generate(
                    prompt, StopRule(max_tokens=24), WeDLMParams(entropy_threshold=tau, lossless=True))
                assert out.token_ids == expected, (prompt, window, tau)
                assert out.num_forwards <= 24
                if window == 1:
                    assert out.num_forwards == 24  # one slot: nothing to check, AR's pace
                fewer_forwards |= out.num_forwards < 24
    if name == "micro":
        assert fewer_forwards, "the trained model's fills should be accepted at times"
