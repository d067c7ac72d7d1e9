"""Per-request decoding mode: a WeDLM engine decodes a request autoregressively when it asks.

``SamplingParams(extra_args={"wedlm_decoding": "ar"})`` (OpenAI: ``vllm_xargs``) on a
``--decoding wedlm`` engine: the request runs one token per forward with the same weights, in the
same batches as WeDLM requests. Greedy, it must be token-exact with the same request on an
``--decoding ar`` engine (vLLM's own sampler), alone and mixed with WeDLM requests; the WeDLM
requests of a mixed batch must be unchanged too, and AR requests must not count as WeDLM windows.
"""

from __future__ import annotations

import pytest

from conftest import VARIANTS
from engines import running_llm
from vllm_wedlm.evaluation import graph_modes, graph_modes_since, request_forwards, vllm_steps

WINDOW = 8
MAX_TOKENS = 40
PROMPTS = [
    "The quiet river reads the number and the lamp holds",
    "1, 2, 3, 4, 5, 6",
    "<|im_start|>user\nAda has 12 apples and buys 30 more.<|im_end|>\n<|im_start|>assistant\n",
    "def window_3(x):\n    return x * 3",
    "Gus",
    "Count from 4 to 19 in steps of 3.",
    "The lamp and the river",
    "7 + 8 = 15. 15 - 4 =",
]


def greedy(**extra):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, extra_args=extra or None)


def token_ids(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.fixture(scope="module", params=VARIANTS)
def runs(request, tiny_checkpoints):
    """Every generation the tests compare, one AR engine and one WeDLM engine per variant."""
    path = tiny_checkpoints[request.param]
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar_engine:
        ar_server = token_ids(ar_engine.generate(PROMPTS, greedy(), use_tqdm=False))
    runs = {"ar_server": ar_server}
    with running_llm(path, dtype="float32", additional_config={"decoding": "wedlm", "window_size": WINDOW}) as llm:
        start, vllm_start = request_forwards(llm), vllm_steps(llm)
        runs["ar_alone"] = token_ids(llm.generate(PROMPTS, greedy(wedlm_decoding="ar"), use_tqdm=False))
        runs["ar_alone_forwards"] = request_forwards(llm) - start
        runs["ar_alone_vllm_steps"] = vllm_steps(llm) - vllm_start
        start, vllm_start = request_forwards(llm), vllm_steps(llm)
        runs["wedlm_alone"] = token_ids(llm.generate(PROMPTS, greedy(), use_tqdm=False))
        runs["wedlm_alone_forwards"] = request_forwards(llm) - start
        runs["wedlm_alone_vllm_steps"] = vllm_steps(llm) - vllm_start
        # Both modes of every prompt in one batch, interleaved; "wedlm" spelt out or left default.
        mixed_params = [greedy(wedlm_decoding=mode) if mode != "default" else greedy()
                        for _ in PROMPTS for mode in ("ar", "default")]
        start, vllm_start = request_forwards(llm), vllm_steps(llm)
        mixed = token_ids(llm.generate([p for p in PROMPTS for _ in range(2)], mixed_params, use_tqdm=False))
        runs["mixed_forwards"] = request_forwards(llm) - start
        runs["mixed_vllm_steps"] = vllm_steps(llm) - vllm_start
        runs["mixed_ar"], runs["mixed_wedlm"] = mixed[0::2], mixed[1::2]
        from vllm import SamplingParams

        with pytest.raises(ValueError, match="wedlm_decoding must be one of 'ar', 'wedlm'"):
            llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, extra_args={"wedlm_decoding": "fast"}),
                         use_tqdm=False)
        runs["after_bad_request"] = token_ids(llm.generate(PROMPTS[:1], greedy(wedlm_decoding="ar"), use_tqdm=False))
    return runs


def test_ar_requests_on_a_wedlm_engine_equal_the_ar_engine(runs):
    assert all(len(ids) == MAX_TOKENS for ids in runs["ar_server"])
    assert runs["ar_alone"] == runs["ar_server"]


def test_mixed_batches_change_neither_mode(runs):
    assert runs["mixed_ar"] == runs["ar_server"]
    assert runs["mixed_wedlm"] == runs["wedlm_alone"]
    # WeDLM really decoded the other half (not one token per forward of the same text).
    assert runs["wedlm_alone"] != runs["ar_server"]


def test_ar_requests_are_not_counted_as_wedlm_windows(runs):
    assert runs["ar_alone_forwards"] == 0
    assert runs["wedlm_alone_forwards"] > 0
    assert runs["mixed_forwards"] == runs["wedlm_alone_forwards"]


def test_steps_of_ar_requests_alone_are_vllms_own(runs):
    """With no request in windows, each step after the prompts' is vLLM's AR step, run whole
    (model_runner.py); a step with a WeDLM request never is. The tokens are checked above."""
    assert runs["ar_alone_vllm_steps"] >= MAX_TOKENS - 1
    assert runs["wedlm_alone_vllm_steps"] == 0
    # Once the WeDLM requests of a mixed batch finish, its AR requests' last steps may be vLLM's.
    assert runs["mixed_vllm_steps"] < runs["ar_alone_vllm_steps"]


def test_a_bad_mode_is_refused_and_the_engine_keeps_serving(runs):
    assert runs["after_bad_request"] == runs["ar_server"][:1]


def test_steps_of_ar_requests_alone_equal_eager_ones():
    """A WeDLM engine's steps in which every request forwards one token (AR requests only) replay
    its CUDA graphs and give the tokens of the same engine run eagerly. On a GPU in bf16
    (FlashAttention 3, FULL graphs) such steps gave wrong tokens while vLLM computed the attention
    schedule outside the graph (lab notebook 5.13); on the CPU there are no graphs, and the two runs
    must agree all the same."""
    from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
    from vllm_wedlm.engine_settings import on_gpu

    # The shipped trained model: on a GPU in bf16 its attention runs FlashAttention, where the tiny
    # random checkpoints' head size does not fit.
    dtype = "bfloat16" if on_gpu() else "float32"
    runs, modes = [], []
    for eager in (False, True):
        with running_llm(MICRO_CHECKPOINT, dtype=dtype, enforce_eager=eager, max_model_len=512, max_num_seqs=64,
                         max_num_batched_tokens=8192,
                         additional_config={"decoding": "wedlm", "window_size": WINDOW}) as llm:
            before = graph_modes(llm)  # warm-up and capture runs
            runs.append(token_ids(llm.generate(PROMPTS, greedy(wedlm_decoding="ar"), use_tqdm=False)))
            modes.append(graph_modes_since(llm, before))
    assert runs[0] == runs[1]
    if on_gpu():
        # Every step after the prefill forwards one token per request, and each replays a graph.
        assert modes[0].get("FULL", 0) >= max(map(len, runs[0])) - 1, modes[0]
        assert "FULL" not in modes[1], modes[1]
