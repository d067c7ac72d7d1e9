"""Log-probs of plain WeDLM tokens: each from the mask row that filled its slot.

A plain window fills a slot from its mask row's draw, possibly steps before the run that holds the
token is returned, and never revises it; ``logprobs`` of a returned token are that row's (its raw
logits' log-softmax, as vLLM gives AR's). The reference decoder records the same value when it
fills the slot (``ReferenceOutput.logprobs``), from transformers' forward: the engine's must equal
it to float32 rounding, token for token, in both row layouts (exact rows, and fixed rows with
padded and with exact rows per step), with other requests beside them that ask nothing or are
lossless, and across preemption (the fills' record is kept by position while a request waits).
"""

from __future__ import annotations

import pytest

from conftest import build_checkpoint
from engines import kv_bytes_per_token, running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

WINDOW = 8
MAX_TOKENS = 40
LOGPROBS = 3
PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
# (fixed window rows, async_padding_tokens): exact rows; fixed rows, every step padded to 2W rows
# (0) or, with a large budget, each window's exact rows (the CPU has no async scheduling).
LAYOUTS = [(False, None), (True, 0), (True, 4096)]
TOLERANCE = 1e-4  # float32 logits of two implementations (vLLM's and transformers' forward)


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    """logit_scale 30: tau 0.4 fills some masks and not others, so runs of several lengths commit."""
    path = build_checkpoint(tmp_path_factory.mktemp("plain-logprobs"), TinySpec(variant="qwen3", logit_scale=30.0))
    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, WINDOW)
    return path, reference


def params(logprobs: int | None = None, max_tokens: int = MAX_TOKENS, **extra):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs,
                          extra_args=extra or None)


def chosen(output) -> tuple[list[int], list[float], list[int]]:
    """A request's tokens, each one's log-prob and rank, from its returned entries."""
    ids = list(output.outputs[0].token_ids)
    entries = [position[token] for position, token in zip(output.outputs[0].logprobs, ids, strict=True)]
    return ids, [e.logprob for e in entries], [e.rank for e in entries]


def check_against_reference(output, expected) -> None:
    ids, logprobs, ranks = chosen(output)
    assert ids == expected.token_ids
    assert max(abs(a - b) for a, b in zip(logprobs, expected.logprobs, strict=True)) < TOLERANCE
    for position, rank in zip(output.outputs[0].logprobs, ranks, strict=True):
        top = sorted((e.rank, e.logprob) for e in position.values())
        assert len(position) in (LOGPROBS, LOGPROBS + 1) and [r for r, _ in top][:LOGPROBS] == [1, 2, 3]
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)  # ranks follow the values
        assert 1 <= rank and (rank <= LOGPROBS or len(position) == LOGPROBS + 1)


@pytest.mark.parametrize("fixed_rows,padding", LAYOUTS, ids=["exact-rows", "fixed-padded", "fixed-exact"])
def test_each_token_carries_the_log_prob_of_the_row_that_filled_it(sharp, fixed_rows, padding):
    path, reference = sharp
    config = {"decoding": "wedlm", "window_size": WINDOW, "fixed_window_rows": fixed_rows}
    if padding is not None:
        config["async_padding_tokens"] = padding
    with running_llm(path, dtype="float32", additional_config=config) as llm:
        tokenizer = llm.get_tokenizer()
        # Plain with log-probs, plain without, lossless with: one batch.
        kinds = [params(LOGPROBS), params(), params(LOGPROBS, wedlm_lossless=True)]
        outputs = llm.generate([p for p in PROMPTS for _ in kinds], [k for _ in PROMPTS for k in kinds],
                               use_tqdm=False)
        alone = llm.generate(PROMPTS, params(), use_tqdm=False)
    longest_run = 0
    for i, prompt in enumerate(PROMPTS):
        asked, silent, lossless = outputs[3 * i: 3 * i + 3]
        expected = reference.generate(tokenizer(prompt).input_ids, StopRule(MAX_TOKENS), WeDLMParams(0.4, 0.02))
        longest_run = max(longest_run, *expected.runs)
        check_against_reference(asked, expected)
        assert list(silent.outputs[0].token_ids) == list(alone[i].outputs[0].token_ids) == expected.token_ids
        assert silent.outputs[0].logprobs is None
        assert len(lossless.outputs[0].logprobs) == MAX_TOKENS  # lossless: AR's (test_request_surface.py)
    assert longest_run > 2  # runs of several tokens, filled over several steps, were returned


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["exact-rows", "fixed-rows"])
def test_log_probs_survive_preemption(sharp, fixed_rows):
    """A batch larger than the KV cache: vLLM preempts plain requests mid-answer and re-prefills
    them; each still gets the log-prob its tokens' filling rows gave."""
    path, reference = sharp
    max_model_len = 160
    prompts = [f"{i}, {i + 1}, {i + 2}, Ada has {i} apples" for i in range(7)]
    config = {"decoding": "wedlm", "window_size": WINDOW, "fixed_window_rows": fixed_rows}
    bytes_per_token = kv_bytes_per_token(WeDLMConfig.from_pretrained(path))
    with running_llm(path, dtype="float32", additional_config=config, max_model_len=max_model_len,
                     kv_cache_memory_bytes=3 * max_model_len * bytes_per_token, block_size=16,
                     disable_log_stats=False) as llm:
        tokenizer = llm.get_tokenizer()
        outputs = llm.generate(prompts, params(LOGPROBS, max_tokens=96), use_tqdm=False)
        preemptions = next(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    assert preemptions > 0, "the batch was meant to force preemption"
    for prompt, output in zip(prompts, outputs, strict=True):
        check_against_reference(output, reference.generate(tokenizer(prompt).input_ids, StopRule(96),
                                                           WeDLMParams(0.4, 0.02)))
