"""The reference decoder against a literal transcription of WeDLM's pseudo-code (wedlm.md 2.9).

The transcription below uses plain Python lists and no ``core`` function, so it checks ``core``
and the decoder independently. One deliberate difference from WeDLM's engine is shared by both:
a window never extends past ``limit`` (prompt + max_tokens), where WeDLM keeps W slots to the end.
"""

from __future__ import annotations

import pytest
import torch

from conftest import build_checkpoint
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule


def literal_wedlm(model, prompt, W, tau, lam, max_tokens, mask, stop_ids=()):
    limit = len(prompt) + max_tokens
    seq = list(prompt)
    win, flags = [mask] * min(W, limit - len(seq)), [True] * min(W, limit - len(seq))
    forwards = 0
    while True:
        L = len(seq)
        p = 0
        while p < len(flags) and not flags[p]:
            p += 1
        add = max(0, min(p, limit - L - len(win)))
        win, flags = win + [mask] * add, flags + [True] * add
        order = [i for i in range(len(win)) if not flags[i]] + [i for i in range(len(win)) if flags[i]]
        ids = seq + [win[i] for i in order]
        pos = list(range(L)) + [L + i for i in order]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos])).logits[0].float()
        forwards += 1
        for t in win[:p]:
            seq.append(t)
            if t in stop_ids or len(seq) >= limit:
                return seq[len(prompt):], forwards
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


def test_partial_fills_happen_and_fill_everything_is_fastest(sharp_model):
    model, mask = sharp_model
    prompt = [5, 17, 33, 8, 2, 41]
    tpf = {}
    for tau in (None, 0.4, 1e9):
        out = ReferenceDecoder(model, mask, 16).generate(prompt, StopRule(max_tokens=48), WeDLMParams(tau, 0.02))
        tpf[tau] = out.tokens_per_forward
    assert tpf[None] < 1.0  # one fill per forward, and the first forward commits nothing
    assert tpf[None] < tpf[0.4] < tpf[1e9]
    assert tpf[1e9] == 48 / 4  # fill 16, then commit 16 per forward: 4 forwards for 48 tokens


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
