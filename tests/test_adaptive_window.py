"""The adaptive window (``window_tokens``, ``--wedlm-window-size auto``) through ``vllm.LLM``.

Each step the engine plans every window with one W chosen from the number of windows
(``WeDLMSettings.step_window_size``), so a request's W changes as others start and finish. The
engine records the W of each window it plans (``wedlm_trace_window_sizes``); the reference decoder,
given that sequence, must produce exactly the engine's tokens and forwards, plain and lossless
requests mixed in one batch. The batch is built so that W moves both ways whatever the order in
which requests reach the engine (they arrive over IPC while it already runs): the first request's
prompt is short and every other one is longer than a step's token budget, so the first request
starts alone (W 16) and is still running when others have finished their chunked prefills (W down);
requests finish at different times and waiting ones take their place, and the last ones run alone.
"""

from __future__ import annotations

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

MAX_WINDOW, WINDOW_TOKENS, TAU = 16, 32, 0.4  # W from 32 // 8 = 4 (a full batch) up to 16 (one request)
MAX_NUM_SEQS = 8
TOKEN_BUDGET = MAX_NUM_SEQS * 2 * MAX_WINDOW  # max_num_batched_tokens: every window fits
PROMPTS = ["0, 1, 2, the lamp reads 0 apples"] + [
    ", ".join(f"{k} apples" for k in range(i, i + 100)) + f", the lamp reads {i * 7}" for i in range(1, 14)]
MAX_TOKENS = [120] + [24 + 9 * (i % 5) for i in range(1, len(PROMPTS))]  # they finish at different steps
LOSSLESS = [i % 3 == 0 for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("adaptive"), TinySpec(variant="qwen2", logit_scale=100.0))


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["exact-rows", "fixed-rows"])
def test_adaptive_window_equals_the_reference_at_the_same_w(checkpoint, fixed_rows):
    """``fixed_rows``: --async-scheduling, fixed window rows (synchronous on a CPU); else
    --no-async-scheduling, exact rows."""
    from vllm import SamplingParams

    config = WeDLMConfig.from_pretrained(checkpoint)
    reference = ReferenceDecoder(load_transformers_model(checkpoint), config.mask_token_id, MAX_WINDOW)
    wedlm = {"decoding": "wedlm", "window_size": MAX_WINDOW, "window_tokens": WINDOW_TOKENS, "entropy_threshold": TAU,
             "fixed_window_rows": fixed_rows}
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, extra_args={"wedlm_lossless": lossless})
              for n, lossless in zip(MAX_TOKENS, LOSSLESS, strict=True)]
    with running_llm(checkpoint, dtype="float32", async_scheduling=fixed_rows,
                     additional_config=wedlm, max_num_seqs=MAX_NUM_SEQS,
                     max_num_batched_tokens=TOKEN_BUDGET) as llm:
        llm.collective_rpc("wedlm_trace_window_sizes", args=(True,))
        forwards_before = sum(llm.collective_rpc("wedlm_request_forwards"))
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        forwards = sum(llm.collective_rpc("wedlm_request_forwards")) - forwards_before
        (trace,) = llm.collective_rpc("wedlm_trace_window_sizes", args=(False,))

    # The premise of the W movements asserted below: only the first prompt fits one step's budget.
    assert [len(o.prompt_token_ids) > TOKEN_BUDGET for o in outputs] == [False] + [True] * (len(PROMPTS) - 1)
    by_request = {internal_id.rsplit("-", 1)[0]: sizes for internal_id, sizes in trace.items()}
    expected_forwards = 0
    for output, n, lossless in zip(outputs, MAX_TOKENS, LOSSLESS, strict=True):
        sizes = by_request[output.request_id]
        expected = reference.generate(list(output.prompt_token_ids), StopRule(max_tokens=n),
                                      WeDLMParams(TAU, 0.02, lossless=lossless), window_sizes=sizes)
        assert list(output.outputs[0].token_ids) == expected.token_ids, (output.request_id, sizes)
        # A window is planned after the prompt and after every forward, the last one included.
        assert len(sizes) == expected.num_forwards + 1, (output.request_id, sizes)
        expected_forwards += expected.num_forwards
    assert forwards == expected_forwards

    # W really moved: the whole window for the first request, alone, then down as others joined
    # (its window kept its fills), and up again as the batch emptied.
    first = by_request[outputs[0].request_id]
    assert first[0] == MAX_WINDOW and min(first) < MAX_WINDOW, first
    assert any(a < b for sizes in by_request.values() for a, b in zip(sizes[:-1], sizes[1:], strict=True)), by_request
    assert len({w for sizes in by_request.values() for w in sizes}) >= 3, by_request
    # And the adaptive window is not the fixed one: at W 16 throughout, requests decode differently.
    fixed = [reference.generate(list(o.prompt_token_ids), StopRule(max_tokens=n), WeDLMParams(TAU, 0.02, lossless=f))
             for o, n, f in zip(outputs, MAX_TOKENS, LOSSLESS, strict=True)]
    assert sum(e.num_forwards for e in fixed) != expected_forwards
