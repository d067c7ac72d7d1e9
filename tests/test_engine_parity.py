"""vLLM's AR decoding of tiny WeDLM checkpoints against transformers' Qwen2/Qwen3 on the same weights.

This is what makes WeDLM and AR comparable on one engine: vLLM builds the checkpoint through the
plugin's registered ``WeDLMForCausalLM`` (vLLM's own Qwen2/Qwen3 model), transformers through its
stock Qwen classes, and both must agree.

Tolerance (float32): vLLM's CPU kernels (fused QKV GEMMs, its own RMSNorm, RoPE and paged
attention) reduce in a different order than transformers' eager PyTorch, so float32 results
differ by rounding only: measured max |delta log-prob| 4e-6 to 5e-6 over the 896-token vocabulary
(values of order 10). 1e-4 is twenty times that rounding and still far below any real bug
(a wrong RoPE position, a missing bias or norm moves log-probs by 1e-2 to 1).
"""

from __future__ import annotations

import pytest
import torch

from engines import running_llm, vllm_prompt_logprobs
from vllm_wedlm.models.transformers_body import load_transformers_model

LOGPROB_ATOL = 1e-4

PROMPTS = [
    "The quiet river reads the number.",
    "1, 2, 3, 4, 5, 6",
    "<|im_start|>user\nAda has 12 apples and buys 30 more.<|im_end|>\n<|im_start|>assistant\n",
    "def window_3(x):\n    return x * 3",
]
# A one-token prompt has no prompt log-probs, but must generate like the rest.
GENERATION_PROMPTS = PROMPTS + ["Gus"]


@pytest.fixture(scope="module")
def engine_and_reference(tiny_checkpoints, variant):
    path = tiny_checkpoints[variant]
    reference = load_transformers_model(path, dtype=torch.float32)
    with running_llm(path, dtype="float32", max_logprobs=-1) as llm:
        yield llm, reference


def test_logprobs_match_transformers(engine_and_reference):
    llm, reference = engine_and_reference
    for prompt in PROMPTS:
        ids, engine_logprobs = vllm_prompt_logprobs(llm, prompt)
        assert not torch.isnan(engine_logprobs).any(), "vLLM returned a partial distribution"
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0, :-1].float()
        expected = torch.log_softmax(logits, dim=-1)
        torch.testing.assert_close(engine_logprobs, expected, atol=LOGPROB_ATOL, rtol=0)
        # The check has teeth: the distributions are far from uniform.
        assert (expected.max(-1).values - expected.min(-1).values).min() > 1.0


def test_greedy_generation_matches_transformers(engine_and_reference):
    from vllm import SamplingParams

    llm, reference = engine_and_reference
    max_tokens = 24
    # One batch: prompts of different lengths decode together in vLLM.
    outputs = llm.generate(GENERATION_PROMPTS, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    for out in outputs:
        prompt_ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            generated = reference.generate(
                prompt_ids, max_new_tokens=max_tokens, do_sample=False, attention_mask=torch.ones_like(prompt_ids)
            )
        expected = generated[0, prompt_ids.shape[1]:].tolist()
        assert list(out.outputs[0].token_ids) == expected, out.prompt
