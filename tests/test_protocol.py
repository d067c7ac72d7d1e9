"""What the WeDLM scheduler and runner agree on (``adapter/protocol.py``): each request's record, read
once per process from its parameters, and each step's plan, one value in vLLM's scheduler output."""

from __future__ import annotations

import pickle

import pytest

from engines import running_llm

PROMPT = "Count from 4 to 19 in steps of 3."


def params(**kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=8, **kwargs)


def settings(**config):
    from vllm_wedlm.config import WeDLMSettings

    return WeDLMSettings.from_additional_config({"decoding": "wedlm", **config})


def test_a_request_is_classified_once_into_its_kind_knobs_and_pin():
    from vllm_wedlm.adapter.protocol import RequestKind, classify

    adaptive = settings()
    plain = classify(params(), adaptive)
    assert plain.kind is RequestKind.PLAIN and plain.windowed and plain.params == adaptive.params
    assert plain.pinned_window is None and plain.pin_error is None and plain.zero_eligible
    ar = classify(params(extra_args={"wedlm_decoding": "ar"}), adaptive)
    assert ar.kind is RequestKind.AR and not ar.windowed and not ar.zero_eligible
    assert classify(params(thinking_token_budget=16), adaptive).kind is RequestKind.AR  # vLLM's budget state
    lossless = classify(params(extra_args={"wedlm_lossless": True, "wedlm_entropy_threshold": 0.7}), adaptive)
    assert lossless.kind is RequestKind.LOSSLESS and lossless.params.entropy_threshold == 0.7
    assert not lossless.zero_eligible  # W 0 is a plain window's
    assert classify(params(extra_args={"wedlm_lossless": False}), settings(lossless=True)).kind is RequestKind.PLAIN
    assert classify(params(), settings(lossless=True)).kind is RequestKind.LOSSLESS
    assert classify(params(extra_args={"wedlm_window_size": 4}), adaptive).pinned_window == 4
    # On a server of a fixed W every window has it: a pin of that W is no pin.
    assert classify(params(extra_args={"wedlm_window_size": 8}), settings(window_size=8)).pinned_window is None


@pytest.mark.parametrize("asks", [dict(logprobs=2), dict(logit_bias={5: 1.0}), dict(min_tokens=4, stop_token_ids=[7]),
                                  dict(presence_penalty=0.5), dict(allowed_token_ids=[1, 2, 3])])
def test_what_a_request_asks_per_row_keeps_it_from_w0(asks):
    """W 0's draw (one AR row, apart from the window step) applies no per-row edit and records no
    log-prob, so a request that asks for one keeps its windows; the record carries what it asked."""
    from vllm_wedlm.adapter.protocol import classify

    record = classify(params(**asks), settings())
    assert not record.zero_eligible
    assert record.logprobs or record.edits is not None or record.context_edits is not None


def test_a_pin_the_front_end_let_through_runs_at_the_servers_w_and_says_why():
    """A front end that validated without this server's settings (one of several API servers) may let
    a pin through that the server cannot run: the engine's processes run the request rather than fail
    on it, at the server's largest W (adaptive) or its one W (fixed), and keep the reason."""
    from vllm_wedlm.adapter.protocol import classify

    above = classify(params(extra_args={"wedlm_window_size": 32}), settings())
    assert above.pinned_window == 16 and "must be in [1, 16]" in above.pin_error
    other = classify(params(extra_args={"wedlm_window_size": 12}), settings(window_size=8))
    assert other.pinned_window is None and "fixed W of 8" in other.pin_error


def test_a_step_plan_travels_as_one_value_with_vllms_fields():
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_wedlm.adapter.protocol import EMPTY_PLAN, WeDLMSchedulerOutput, WeDLMStepPlan, plan_of

    output = SchedulerOutput.make_empty()
    output.num_scheduled_tokens["a"] = 3
    plan = WeDLMStepPlan(window_sizes={"a": 4}, forwarded_sizes={"a": 8}, first_windows={"b": 16}, mask_rows=8,
                         padded=True, redrawn=("c",))
    wedlm = WeDLMSchedulerOutput.of(output, plan)
    assert isinstance(wedlm, SchedulerOutput) and plan_of(wedlm) is plan
    assert wedlm.num_scheduled_tokens is output.num_scheduled_tokens  # vLLM's fields, shared
    sent = pickle.loads(pickle.dumps(wedlm))  # as vLLM's executor sends it to a worker process
    assert plan_of(sent) == plan and sent.num_scheduled_tokens == {"a": 3}
    assert plan_of(output) is EMPTY_PLAN  # an output vLLM made itself
    assert not hasattr(output, "wedlm_plan")  # nothing set on vLLM's object


def test_an_engine_runs_a_pin_its_front_end_should_have_refused(tiny_checkpoints):
    """A fixed-W engine (W 8) given a request pinned at W 12 that a front end with other settings let
    through: the request runs at W 8 (the same tokens as unpinned) and the engine keeps serving."""
    from vllm_wedlm.adapter import request_validator
    from vllm_wedlm.config import WeDLMSettings

    greedy = dict(temperature=0.0, ignore_eos=True)
    try:
        with running_llm(tiny_checkpoints["qwen3"], dtype="float32",
                         additional_config={"decoding": "wedlm", "window_size": 8}) as llm:
            request_validator.serve(WeDLMSettings.from_additional_config({"decoding": "wedlm"}))  # another front end's
            unpinned = llm.generate([PROMPT], params(**greedy), use_tqdm=False)
            pinned = llm.generate([PROMPT], params(**greedy, extra_args={"wedlm_window_size": 12}), use_tqdm=False)
            after = llm.generate([PROMPT], params(**greedy), use_tqdm=False)
    finally:
        request_validator.serve(WeDLMSettings())
    tokens = [list(out[0].outputs[0].token_ids) for out in (unpinned, pinned, after)]
    assert len(tokens[0]) == 8 and tokens[0] == tokens[1] == tokens[2]
