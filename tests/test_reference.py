"""The reference decoder against a literal transcription of WeDLM's pseudo-code (wedlm.md 2.9).

The transcription below uses plain Python lists and no ``core`` function, so it checks ``core``
and the decoder independently. As in WeDLM's engine (2.7), the window keeps W undecided slots up
to the end, whatever max_tokens is; its only bound is the KV room of a vLLM request, which ends at
max_model_len (WeDLM's kv_budget, 2.8). A request ends as soon as the leading run of decided
slots reaches a stop: those tokens need no further forward to be known.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.commit_runs import reach
from conftest import build_checkpoint
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

pytestmark = pytest.mark.fast  # the fast tier: `pytest -m fast` (README)


def literal_wedlm(model, prompt, W, tau, lam, max_tokens, mask, stop_ids=(), max_model_len=None, runs=None):
    """The output and the forwards it took; ``runs``, a list, gets the tokens each forward committed."""
    def kv_budget(L):  # window slots that fit after L tokens
        return math.inf if max_model_len is None else max_model_len - L

    seq = list(prompt)
    win, flags = [mask] * min(W, kv_budget(len(seq))), [True] * min(W, kv_budget(len(seq)))
    forwards = 0
    while True:
        L = len(seq)
        p = 0
        while p < len(flags) and not flags[p]:
            p += 1
        add = max(0, min(p, kv_budget(L) - len(win)))
        win, flags = win + [mask] * add, flags + [True] * add
        for k in range(p):  # the decided leading run: a stop inside it ends the request before the forward
            out = seq + win[:k + 1]
            if win[k] in stop_ids or len(out) - len(prompt) >= max_tokens or len(out) == max_model_len:
                if runs is not None and forwards:
                    runs.append(k + 1)
                return out[len(prompt):], forwards
        if runs is not None and forwards:
            runs.append(p)
        order = [i for i in range(len(win)) if not flags[i]] + [i for i in range(len(win)) if flags[i]]
        ids = seq + [win[i] for i in order]
        pos = list(range(L)) + [L + i for i in order]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos])).logits[0].float()
        forwards += 1
        seq += win[:p]
        win, flags = win[p:], flags[p:]
        masks = [i for i in range(len(win)) if flags[i]]
        rows = logits[len(logits) - len(masks):]
        adjusted = []
        for k, i in enumerate(masks):
            probs = torch.softmax(rows[k], -1)
            entropy = float(-(probs * torch.log_softmax(rows[k], -1)).sum())
            adjusted.append(entropy + lam * (i - masks[0]))
        chosen = [k for k in range(len(masks)) if tau is not None and adjusted[k] < tau]
        if not chosen:
            chosen = [min(range(len(masks)), key=lambda k: (adjusted[k], k))]
        for k in chosen:
            row = rows[k].clone()
            row[mask] = -float("inf")
            win[masks[k]] = int(row.argmax())
            flags[masks[k]] = False


@pytest.fixture(scope="module")
def sharp_model(tmp_path_factory):
    """logit_scale 30: mask entropies spread around 0.25 to 1.8 nats, so tau 0.4 fills some masks
    and not others (random weights at scale 1 are near-uniform and never pass tau)."""
    path = build_checkpoint(tmp_path_factory.mktemp("ref"), TinySpec(variant="qwen3", logit_scale=30.0))
    return load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id


@pytest.mark.parametrize("W,tau,lam", [(1, None, 0.0), (4, 0.4, 0.02), (16, 0.4, 0.02), (16, None, 1.0),
                                       (16, 1e9, 0.0), (4, 1.0, 0.02)])
def test_reference_equals_the_literal_algorithm(sharp_model, W, tau, lam):
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    decoder = ReferenceDecoder(model, mask_token_id=mask, window_size=W)
    out = decoder.generate(prompt, StopRule(max_tokens=24), WeDLMParams(entropy_threshold=tau, pos_penalty=lam))
    expected, forwards = literal_wedlm(model, prompt, W, tau, lam, 24, mask)
    assert out.token_ids == expected
    assert out.num_forwards == forwards and out.finish_reason == "length"


@pytest.mark.parametrize("W,tau", [(4, 0.4), (16, 0.4), (16, None), (16, 1e9)])
def test_runs_are_what_each_forward_committed(sharp_model, W, tau):
    """ReferenceOutput.runs (benchmarks/commit_runs.py's data): the literal algorithm's leading run
    after each forward, one per forward, adding up to the output; 0 where a plain step's fill left
    the first slot open, which happens at tau None (one fill a step, not always the first)."""
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    out = ReferenceDecoder(model, mask, W).generate(prompt, StopRule(max_tokens=40), WeDLMParams(tau, 0.02))
    expected: list[int] = []
    literal_wedlm(model, prompt, W, tau, 0.02, 40, mask, runs=expected)
    assert out.runs == expected
    assert len(out.runs) == out.num_forwards and sum(out.runs) == len(out.token_ids) == 40
    if tau == 1e9:
        assert out.runs[:-1] == [W] * (len(out.runs) - 1)
    if tau is None:
        assert 0 in out.runs
    assert reach(out.runs, W)[0] == pytest.approx(sum(r > 0 for r in out.runs) / len(out.runs), abs=1e-4)


def test_reach_is_the_share_of_runs_that_reached_each_slot():
    assert reach([0, 1, 3, 4], 4) == [0.75, 0.5, 0.5, 0.25]
    assert reach([], 2) == [0.0, 0.0]


def test_lossless_runs_commit_at_least_the_ar_token(sharp_model):
    model, mask = sharp_model
    out = ReferenceDecoder(model, mask, 8).generate([5, 17, 33, 8, 2, 41], StopRule(max_tokens=40),
                                                    WeDLMParams(0.4, 0.02, lossless=True))
    assert len(out.runs) == out.num_forwards and sum(out.runs) == len(out.token_ids) == 40
    assert min(out.runs) >= 1


def test_partial_fills_happen_and_fill_everything_is_fastest(sharp_model):
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    tpf = {}
    for tau in (None, 0.4, 1e9):
        out = ReferenceDecoder(model, mask, 16).generate(prompt, StopRule(max_tokens=48), WeDLMParams(tau, 0.02))
        tpf[tau] = out.tokens_per_forward
    assert tpf[None] <= 1.0  # one fill per forward
    assert tpf[None] < tpf[0.4] < tpf[1e9]
    # Fill 16 per forward; each run of 16 is known (and returned) once filled: 3 forwards for 48.
    assert tpf[1e9] == 48 / 3


def test_stop_token_ends_at_the_token_and_keeps_it(sharp_model):
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    decoder = ReferenceDecoder(model, mask, 8)
    full = decoder.generate(prompt, StopRule(max_tokens=24), WeDLMParams(0.4, 0.02)).token_ids
    stop_at = full[10]
    first = full.index(stop_at)
    out = decoder.generate(prompt, StopRule(max_tokens=24, stop_token_ids=frozenset({stop_at})),
                           WeDLMParams(0.4, 0.02))
    assert out.token_ids == full[: first + 1] and out.finish_reason == "stop"


@pytest.fixture(scope="module")
def sharper_model(tmp_path_factory):
    """logit_scale 100: tau 0.4 fills about half of a window's masks per forward here."""
    path = build_checkpoint(tmp_path_factory.mktemp("ref100"), TinySpec(variant="qwen3", logit_scale=100.0))
    return load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id


@pytest.mark.parametrize("W", [4, 8, 16])
def test_tokens_do_not_depend_on_max_tokens(sharper_model, W):
    """A request's first n tokens are the same for every max_tokens >= n, in the literal algorithm
    and in the reference decoder: the window near the end still holds W undecided slots."""
    model, mask = sharper_model
    prompt = [5, 17, 33, 8, 2, 41]
    decoder = ReferenceDecoder(model, mask, W)
    longest, forwards = literal_wedlm(model, prompt, W, 0.4, 0.02, 100, mask)
    assert len(longest) == 100 and 1.3 < 100 / forwards < 0.8 * W  # partial fills
    for n in [*range(5, 100, 12), 100]:
        out = decoder.generate(prompt, StopRule(max_tokens=n), WeDLMParams(0.4, 0.02))
        assert out.token_ids == literal_wedlm(model, prompt, W, 0.4, 0.02, n, mask)[0] == longest[:n], n
        assert out.finish_reason == "length"


def test_window_shrinks_only_at_max_model_len(sharper_model):
    """At max_model_len the window is cut to the room left (no slot past it) and the request ends
    there, however large max_tokens is."""
    model, mask = sharper_model
    prompt = [5, 17, 33, 8, 2, 41]
    decoder = ReferenceDecoder(model, mask, 16)
    out = decoder.generate(prompt, StopRule(max_tokens=1000, max_model_len=50), WeDLMParams(0.4, 0.02))
    expected, forwards = literal_wedlm(model, prompt, 16, 0.4, 0.02, 1000, mask, max_model_len=50)
    assert out.token_ids == expected and len(expected) == 50 - len(prompt)
    assert out.num_forwards == forwards and out.finish_reason == "length"


def ar_greedy_with_logprobs(model, prompt: list[int], count: int) -> tuple[list[int], list[float]]:
    """Greedy next-token decoding with transformers (full recompute each token), and the log-prob of
    each token drawn."""
    sequence, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(count):
            row = torch.log_softmax(model(input_ids=torch.tensor([sequence])).logits[0, -1].float(), -1)
            sequence.append(int(row.argmax()))
            logprobs.append(float(row[sequence[-1]]))
    return sequence[len(prompt):], logprobs


@pytest.mark.parametrize("lossless", [False, True], ids=["plain", "lossless"])
def test_windows_of_w0_throughout_are_ar_decoding(sharp_model, lossless):
    """W 0 is an AR step (the adaptive window's floor): one forward, one token, AR's token."""
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    expected, expected_logprobs = ar_greedy_with_logprobs(model, prompt, 20)
    out = ReferenceDecoder(model, mask, 8).generate(prompt, StopRule(max_tokens=20), WeDLMParams(0.4, 0.02, lossless),
                                                    window_sizes=[0] * 40)
    assert out.token_ids == expected
    assert out.num_forwards == 20 and out.runs == [1] * 20
    if not lossless:
        assert out.logprobs == pytest.approx(expected_logprobs, abs=1e-4)


@pytest.mark.parametrize("lossless", [False, True], ids=["plain", "lossless"])
def test_ar_steps_then_windows_continue_from_the_ar_tokens(sharp_model, lossless):
    """After j AR steps a request holds AR's first j tokens, the last one leading its window: its
    windows from there on are those of a request whose prompt ends with them."""
    model, mask = sharp_model
    prompt, j, n = [5, 17, 33, 8, 2, 41], 5, 30
    decoder = ReferenceDecoder(model, mask, 8)
    params = WeDLMParams(0.4, 0.02, lossless)
    out = decoder.generate(prompt, StopRule(max_tokens=n), params, window_sizes=[0] * j)
    ar, _ = ar_greedy_with_logprobs(model, prompt, j)
    rest = decoder.generate(prompt + ar, StopRule(max_tokens=n - j), params)
    assert out.token_ids == ar + rest.token_ids
    assert out.num_forwards == j + rest.num_forwards


@pytest.mark.parametrize("lossless", [False, True], ids=["plain", "lossless"])
def test_windows_then_ar_steps_continue_greedily_from_the_committed_tokens(sharp_model, lossless):
    """A window that falls to W 0 commits its leading run (a lossless one its verified slot 0),
    drops its other fills, and every token after that is AR's from what was committed."""
    model, mask = sharp_model
    prompt, k, n = [5, 17, 33, 8, 2, 41], 3, 30
    out = ReferenceDecoder(model, mask, 16).generate(prompt, StopRule(max_tokens=n), WeDLMParams(1e9, 0.0, lossless),
                                                     window_sizes=[16] * k + [0] * n)
    # The tokens committed by the k window forwards (a plain window's last run is returned before the
    # AR step; a lossless one's slot 0, which that step commits, is AR's token already).
    committed = sum(out.runs[:k])
    assert committed >= k  # the windows committed something (tau 1e9 fills them whole)
    ar, _ = ar_greedy_with_logprobs(model, prompt + out.token_ids[:committed], n - committed)
    assert out.token_ids[committed:] == ar
    assert out.runs[k + 1:] == [1] * (len(out.runs) - k - 1)


def test_lossless_decoding_is_ar_decoding_at_every_w_sequence(sharp_model):
    """Lossless windows give AR's tokens whatever their W, W 0 included, in any order."""
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    expected, _ = ar_greedy_with_logprobs(model, prompt, 32)
    for sizes in ([4, 0, 0, 8, 1, 0, 16, 0, 2] * 6, [0, 16] * 20, [16, 16, 0] * 20):
        out = ReferenceDecoder(model, mask, 8).generate(prompt, StopRule(max_tokens=32),
                                                        WeDLMParams(0.4, 0.02, lossless=True), window_sizes=sizes)
        assert out.token_ids == expected, sizes
