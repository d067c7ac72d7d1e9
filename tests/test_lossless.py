"""Lossless WeDLM in the engine: ``wedlm_lossless`` requests are AR decoding, at several tokens per forward.

Greedy, a lossless request on a ``--decoding wedlm`` engine must give exactly the tokens of the same
request on a ``--decoding ar`` engine over the same weights, for every tau, alone or batched with
plain WeDLM and AR requests (which stay as they are), whatever its max_tokens, through EOS, stop
strings, preemption and prefix caching; and exactly what the reference decoder gives, forward for
forward. Sampled, its tokens must follow the AR distribution: a chi-square test of the joint
distribution of the first tokens against the probabilities transformers computes.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from chi_square import chi_square_p_value
from conftest import build_checkpoint
from engines import kv_bytes_per_token, running_llm
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.evaluation import request_forwards
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

MAX_TOKENS = 32
SHORT = 7
TAUS = (None, 0.4, 1e9)
PROMPTS = [
    "1, 2, 3, 4, 5, 6",
    "The quiet river reads the number and the lamp holds",
    "<|im_start|>user\nAda has 12 apples and buys 30 more.<|im_end|>\n<|im_start|>assistant\n",
    "Gus",
    "Count from 4 to 19 in steps of 3.",
]
# (checkpoint, server-wide window, fixed window rows): both published bodies with sharpened random
# weights (fills that often pass and often fail the check), and the trained micro model (fills
# mostly right); exact rows (--no-async-scheduling) and the fixed rows of --async-scheduling (a
# large model's default on a GPU; synchronous on a CPU).
CASES = [("qwen3-sharp", 4, False), ("qwen2-sharp", 16, False), ("micro", 8, False), ("qwen3-sharp", 4, True),
         ("micro", 8, True)]


def greedy(max_tokens=MAX_TOKENS, ignore_eos=True, **extra):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos, extra_args=extra or None)


def lossless(tau=0.4, **kwargs):
    return greedy(**kwargs, wedlm_lossless=True, wedlm_entropy_threshold=tau)


def token_ids(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    return {"qwen3-sharp": build_checkpoint(root, TinySpec(variant="qwen3", logit_scale=30.0)),
            "qwen2-sharp": build_checkpoint(root, TinySpec(variant="qwen2", logit_scale=30.0)),
            "micro": MICRO_CHECKPOINT}


@pytest.fixture(scope="module", params=CASES,
                ids=[f"{name}-W{w}{'-fixed-rows' if fixed else ''}" for name, w, fixed in CASES])
def runs(request, checkpoints):
    """Every generation the tests compare: one AR engine and one WeDLM engine per case."""
    name, window, fixed_rows = request.param
    path = checkpoints[name]
    runs = {"name": name, "path": path, "window": window}
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar:
        runs["ar"] = token_ids(ar.generate(PROMPTS, greedy(), use_tqdm=False))
        runs["ar_eos"] = ar.generate(PROMPTS, greedy(ignore_eos=False), use_tqdm=False)
    config = {"decoding": "wedlm", "window_size": window, "fixed_window_rows": fixed_rows}
    # --async-scheduling (fixed rows; synchronous on a CPU) or --no-async-scheduling (exact rows).
    with running_llm(path, dtype="float32", async_scheduling=fixed_rows,
                     additional_config=config, enable_prefix_caching=True,
                     block_size=16) as llm:
        for tau in TAUS:
            start = request_forwards(llm)
            runs[tau] = token_ids(llm.generate(PROMPTS, lossless(tau), use_tqdm=False))
            runs[("forwards", tau)] = request_forwards(llm) - start
        runs["short"] = token_ids(llm.generate(PROMPTS, lossless(max_tokens=SHORT), use_tqdm=False))
        runs["plain"] = token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False))
        mixed = [lossless(), greedy(), greedy(wedlm_decoding="ar")]
        outputs = token_ids(llm.generate([p for p in PROMPTS for _ in mixed], mixed * len(PROMPTS), use_tqdm=False))
        runs["mixed_lossless"], runs["mixed_plain"], runs["mixed_ar"] = outputs[0::3], outputs[1::3], outputs[2::3]
        runs["eos"] = llm.generate(PROMPTS, lossless(ignore_eos=False), use_tqdm=False)
        # Prefix caching: a prompt that continues an earlier lossless answer reuses its KV.
        first = llm.generate(PROMPTS[:1], lossless(max_tokens=48), use_tqdm=False)[0]
        runs["extended_prompt"] = list(first.prompt_token_ids) + list(first.outputs[0].token_ids)
        runs["extended"] = llm.generate([{"prompt_token_ids": runs["extended_prompt"]}], lossless(max_tokens=16),
                                        use_tqdm=False)[0]
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar:
        runs["ar_extended"] = token_ids(ar.generate([{"prompt_token_ids": runs["extended_prompt"]}],
                                                    greedy(max_tokens=16), use_tqdm=False))[0]
    return runs


def test_lossless_equals_the_ar_engine_for_every_tau(runs):
    assert all(len(ids) == MAX_TOKENS for ids in runs["ar"])
    for tau in TAUS:
        assert runs[tau] == runs["ar"], tau
    assert runs["plain"] != runs["ar"] or runs["name"] == "micro"  # plain WeDLM is not AR on random weights


def test_lossless_commits_several_tokens_per_forward_when_fills_are_right(runs):
    tokens = MAX_TOKENS * len(PROMPTS)
    for tau in TAUS:
        assert runs[("forwards", tau)] <= tokens
    if runs["name"] == "micro":
        assert runs[("forwards", 1e9)] < 0.8 * tokens, runs[("forwards", 1e9)]


def test_lossless_equals_its_reference_decoder_forward_for_forward(runs):
    path = runs["path"]
    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id,
                                 runs["window"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    forwards = 0
    for prompt, ids in zip(PROMPTS, runs[0.4], strict=True):
        out = reference.generate(tokenizer.encode(prompt), StopRule(max_tokens=MAX_TOKENS),
                                 WeDLMParams(entropy_threshold=0.4, lossless=True))
        assert out.token_ids == ids
        forwards += out.num_forwards
    assert forwards == runs[("forwards", 0.4)]


def test_mixed_batches_change_no_mode(runs):
    assert runs["mixed_lossless"] == runs["ar"]
    assert runs["mixed_ar"] == runs["ar"]
    assert runs["mixed_plain"] == runs["plain"]


def test_max_tokens_only_truncates(runs):
    assert runs["short"] == [ids[:SHORT] for ids in runs["ar"]]


def test_eos_ends_a_lossless_request_as_it_ends_an_ar_one(runs):
    for out, ar in zip(runs["eos"], runs["ar_eos"], strict=True):
        assert list(out.outputs[0].token_ids) == list(ar.outputs[0].token_ids)
        assert out.outputs[0].finish_reason == ar.outputs[0].finish_reason
        assert out.outputs[0].text == ar.outputs[0].text
    if runs["name"] == "micro":  # the trained model ends its answers
        assert any(ar.outputs[0].finish_reason == "stop" for ar in runs["ar_eos"])


def test_prefix_caching_reuses_lossless_kv(runs):
    extended = runs["extended"]
    assert extended.num_cached_tokens > len(runs["extended_prompt"]) - 48  # hits inside the answer
    assert list(extended.outputs[0].token_ids) == runs["ar_extended"]


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["exact-rows", "fixed-rows"])
def test_stop_strings_and_preemption_keep_lossless_equal_to_ar(checkpoints, fixed_rows):
    """A server-wide lossless engine (additional_config lossless) whose KV cache holds three
    requests, with a token budget that chunks the long prompt: vLLM preempts and re-prefills, and
    every answer is still the AR engine's, stop strings included. A request may opt out."""
    path = checkpoints["qwen3-sharp"]
    bytes_per_token = kv_bytes_per_token(WeDLMConfig.from_pretrained(path))
    max_model_len = 160
    prompts = [f"{i}, {i + 1}, {i + 2}, Ada has {i} apples" for i in range(7)]
    prompts.append(", ".join(str(i) for i in range(1, 70)))  # longer than the token budget
    from vllm import SamplingParams

    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}, max_model_len=max_model_len) as ar:
        expected = ar.generate(prompts, greedy(96), use_tqdm=False)
        stop = next(o.outputs[0].text[20:23] for o in expected if o.outputs[0].text[20:23].strip())
        stopped = ar.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True, stop=[stop]),
                              use_tqdm=False)
    engine = {"decoding": "wedlm", "window_size": 8, "lossless": True, "fixed_window_rows": fixed_rows}
    with running_llm(path, dtype="float32", async_scheduling=fixed_rows,
                     additional_config=engine, max_model_len=max_model_len,
                     kv_cache_memory_bytes=3 * max_model_len * bytes_per_token, block_size=16,
                     max_num_batched_tokens=128, enable_chunked_prefill=True, disable_log_stats=False) as small:
        outputs = small.generate(prompts, greedy(96), use_tqdm=False)
        preemptions = [m.value for m in small.get_metrics() if m.name == "vllm:num_preemptions"]
        with_stop = small.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True,
                                                           stop=[stop]), use_tqdm=False)
        opted_out = small.generate(prompts[:1], greedy(96, wedlm_lossless=False), use_tqdm=False)
    assert preemptions and preemptions[0] > 0, "the batch was meant to force preemption"
    assert token_ids(outputs) == token_ids(expected)
    assert [o.outputs[0].text for o in with_stop] == [o.outputs[0].text for o in stopped]
    assert any(o.outputs[0].finish_reason == "stop" for o in stopped)
    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, 8)
    plain = reference.generate(list(opted_out[0].prompt_token_ids), StopRule(96, max_model_len=max_model_len))
    assert token_ids(opted_out) == [plain.token_ids] and plain.token_ids != token_ids(expected)[0]


# Sampling: the first TOKENS tokens of many requests of one prompt, top-k 3 so that the joint
# outcomes are few enough to count, on the trained model (its fills often pass the check, so a
# wrong acceptance rule would show) at a temperature that spreads the three choices.
SAMPLED_REQUESTS = 3000
TOKENS = 4
TEMPERATURE = 1.5
TOP_K = 3
MIN_P_VALUE = 1e-4


def ar_joint_distribution(model, prompt: list[int], mask_id: int) -> dict[tuple[int, ...], float]:
    """P(first TOKENS tokens) under top-k / temperature sampling of ``model``'s next-token rows
    (the mask token is not banned there, as in --decoding ar)."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(TOKENS):
        grown = {}
        for prefix, p in probs.items():
            with torch.no_grad():
                row = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1].double()
            top = torch.topk(row, TOP_K)
            for token, q in zip(top.indices.tolist(), torch.softmax(top.values / TEMPERATURE, -1).tolist(),
                                strict=True):
                grown[prefix + (token,)] = p * q
        probs = grown
    return probs


def test_sampled_lossless_tokens_follow_the_ar_distribution():
    from vllm import SamplingParams

    path = MICRO_CHECKPOINT
    prompt = "<|im_start|>user\nCount from 3 to 15 in steps of 2.<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_tokens=TOKENS, ignore_eos=True,
                            extra_args={"wedlm_lossless": True, "wedlm_entropy_threshold": 1e9})
    with running_llm(path, dtype="float32", additional_config={"decoding": "wedlm", "window_size": 8}) as llm:
        start = request_forwards(llm)
        outputs = llm.generate([prompt] * SAMPLED_REQUESTS, params, use_tqdm=False)
        forwards = request_forwards(llm) - start
    prompt_ids = list(outputs[0].prompt_token_ids)
    expected = ar_joint_distribution(load_transformers_model(path), prompt_ids,
                                     WeDLMConfig.from_pretrained(path).mask_token_id)
    counts = Counter(tuple(out.outputs[0].token_ids) for out in outputs)
    assert set(counts) <= set(expected), "a sequence with no probability under AR sampling came out"
    # Outcomes expected fewer than 5 times are pooled into one cell (the chi-square approximation).
    big = [seq for seq, p in expected.items() if p * SAMPLED_REQUESTS >= 5]
    observed = [counts[seq] for seq in big] + [SAMPLED_REQUESTS - sum(counts[seq] for seq in big)]
    probs = [expected[seq] for seq in big] + [1 - sum(expected[seq] for seq in big)]
    assert len(big) >= 5
    assert math.isclose(sum(probs), 1.0)
    assert chi_square_p_value(observed, [p * SAMPLED_REQUESTS for p in probs]) > MIN_P_VALUE
    # Fills were accepted. A request's first window is forwarded with the end of its prompt and counts,
    # so a request whose fills all fail takes TOKENS windows; at least a tenth of the tokens must have
    # come from accepted fills (the micro model here: about a quarter, 9,031 windows for 12,000 tokens).
    assert forwards < 0.9 * SAMPLED_REQUESTS * TOKENS, forwards

