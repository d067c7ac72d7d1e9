"""Fixed window rows (``fixed_window_rows``; what ``--async-scheduling`` runs on a GPU): every
window forwards 2W rows laid out from the runner's device table, so a step needs nothing back on
the host from the step before. Greedy output must still be the reference decoder's, token for
token; the requests it cannot serve are turned away with a clear error, the engine unharmed.
On the CPU the engine schedules synchronously (vLLM's CPU platform has no async scheduling); on a
GPU the same tests run it with async scheduling.
"""

from __future__ import annotations

import itertools

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule
from vllm_wedlm.testing import on_gpu

PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
TAUS = (None, 0.4, 1e9)
LAMBDAS = (0.0, 1.0)
MAX_TOKENS = 24


@pytest.mark.parametrize("window", [4, 16])
def test_fixed_rows_equal_reference(tmp_path, window):
    from vllm import SamplingParams

    path = build_checkpoint(tmp_path, TinySpec(variant="qwen3", logit_scale=30.0))
    combos = list(itertools.product(TAUS, LAMBDAS, PROMPTS))
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                             extra_args={"wedlm_entropy_threshold": tau, "wedlm_pos_penalty": lam})
              for tau, lam, _ in combos]
    config = {"decoding": "wedlm", "window_size": window, "fixed_window_rows": True}
    with running_llm(path, dtype="float32", additional_config=config) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling == on_gpu()
        outputs = llm.generate([p for *_, p in combos], params, use_tqdm=False)
        forwards = sum(llm.collective_rpc("wedlm_request_forwards"))
        # Per-request modes it cannot run: a clear error for that request, nothing else disturbed.
        for extra_args in ({"wedlm_lossless": True}, {"wedlm_decoding": "ar"}):
            with pytest.raises(ValueError, match="--no-async-scheduling"):
                llm.generate(["Gus"], SamplingParams(max_tokens=4, extra_args=extra_args), use_tqdm=False)
        again = llm.generate(PROMPTS[:1], params[:1], use_tqdm=False)
    assert list(again[0].outputs[0].token_ids) == list(outputs[0].outputs[0].token_ids)

    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, window)
    expected_forwards = 0
    for (tau, lam, prompt), out in zip(combos, outputs, strict=True):
        expected = reference.generate(list(out.prompt_token_ids), StopRule(max_tokens=MAX_TOKENS),
                                      WeDLMParams(entropy_threshold=tau, pos_penalty=lam))
        assert list(out.outputs[0].token_ids) == expected.token_ids, (tau, lam, prompt)
        expected_forwards += expected.num_forwards
    # One window forward per reference forward: fixed rows cost no extra steps. Async scheduling
    # may add one per request, scheduled before the step that ends the request is back.
    assert 0 <= forwards - expected_forwards <= (len(combos) if on_gpu() else 0)


@pytest.mark.parametrize("extra", [{"lossless": True}, {"window_size": "auto"}, {"window_tokens": 64}])
def test_fixed_rows_refuse_what_they_cannot_run(extra):
    with pytest.raises(ValueError, match="async-scheduling"):
        WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": True, **extra})


def test_fixed_rows_setting_is_a_boolean():
    with pytest.raises(ValueError, match="fixed_window_rows must be true or false"):
        WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": "yes"})
    assert WeDLMSettings.from_additional_config({"decoding": "wedlm", "fixed_window_rows": True}).fixed_window_rows
