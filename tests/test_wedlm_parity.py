"""Invariant 1: greedy ``--decoding wedlm`` in vLLM equals the reference decoder, token for token.

Grid: window W in {1, 4, 16} (server-wide, one engine each), threshold tau in {None, 0.4, 1e9}
and penalty lambda in {0, 0.02, 1} (per request, through extra_args), with every combination
and prompts of different lengths submitted as one batch, so requests in different window
states share each forward. Checkpoints: both variants with a sharpened lm_head (logit_scale 30:
mask entropies spread around tau = 0.4, so partial fills really happen), and one plain one
(scale 8, entropies far above tau: one fill per step).
"""

from __future__ import annotations

import itertools

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.evaluation import window_steps
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

TAUS = (None, 0.4, 1e9)
LAMBDAS = (0.0, 0.02, 1.0)
PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
MAX_TOKENS = 24

CASES = [("qwen3", 30.0, w) for w in (1, 4, 16)] + [("qwen2", 30.0, w) for w in (1, 4, 16)] + [("qwen3", 8.0, 16)]


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    return tmp_path_factory.mktemp("parity")


@pytest.mark.parametrize("variant,scale,window", CASES, ids=[f"{v}-scale{s:g}-W{w}" for v, s, w in CASES])
def test_engine_equals_reference(checkpoint_root, variant, scale, window):
    from vllm import SamplingParams
    from vllm.config import CompilationMode

    path = build_checkpoint(checkpoint_root, TinySpec(variant=variant, logit_scale=scale))
    combos = list(itertools.product(TAUS, LAMBDAS, PROMPTS))
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                             extra_args={"wedlm_entropy_threshold": tau, "wedlm_pos_penalty": lam})
              for tau, lam, _ in combos]
    config = {"decoding": "wedlm", "window_size": window}
    with running_llm(path, dtype="float32", additional_config=config) as llm:
        outputs = llm.generate([p for *_, p in combos], params, use_tqdm=False)
        plain_steps = window_steps(llm)
        compiles = llm.llm_engine.vllm_config.compilation_config.mode == CompilationMode.VLLM_COMPILE
    # Steps of plain windows ran their device work compiled where the engine compiles (a GPU
    # without --enforce-eager: start-up compiled every variant they met), else eagerly.
    ran, never = ("compiled", "eager") if compiles else ("eager", "compiled")
    assert plain_steps[ran] > 0 and plain_steps[never] == 0, plain_steps

    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, window)
    forwards = {}
    for (tau, lam, prompt), out in zip(combos, outputs, strict=True):
        expected = reference.generate(list(out.prompt_token_ids), StopRule(max_tokens=MAX_TOKENS),
                                      WeDLMParams(entropy_threshold=tau, pos_penalty=lam))
        assert list(out.outputs[0].token_ids) == expected.token_ids, (tau, lam, prompt)
        forwards.setdefault(tau, []).append(expected.num_forwards)
    if window > 1:
        # Fill-everything commits whole windows; one-per-step needs a forward per token.
        assert max(forwards[1e9]) < min(forwards[None])
    if scale == 30.0 and window == 16:
        # Partial fills: tau 0.4 is strictly between the two extremes on average.
        mean = {tau: sum(f) / len(f) for tau, f in forwards.items()}
        assert mean[1e9] < mean[0.4] < mean[None]
