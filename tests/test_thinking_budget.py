"""vLLM's ``thinking_token_budget`` in WeDLM mode (an engine with a reasoning parser).

A request with a budget decodes AR under vLLM's own budget state (``config.decodes_ar``,
``RowLayout.end_thinking``), so in every mode its greedy tokens must equal an ``--decoding ar``
engine's, beside WeDLM requests without one, which must not change: on exact window rows and on
fixed ones (the async engine's; on a GPU these tests run it under async scheduling, where the
budget state reads output lists whose last token is in flight).
"""

from __future__ import annotations

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec

# Chat prompts that open a thinking block (the tiny tokenizer spells "<think>" in several tokens).
PROMPTS = ["<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n<think>\n",
           "1, 2, 3, 4 <think>", "<|im_start|>user\nThe quiet river<|im_end|>\n<|im_start|>assistant\n<think>\n"]
BUDGETS = (None, 0, 3)
MAX_TOKENS = 24
MODES = ("plain", "lossless", "ar")


def params(budget: int | None, mode: str = "plain"):
    from vllm import SamplingParams

    extra = {"wedlm_lossless": True} if mode == "lossless" else {"wedlm_decoding": "ar"} if mode == "ar" else None
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, thinking_token_budget=budget,
                          extra_args=extra)


def token_ids(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.fixture(scope="module")
def ar_runs(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("thinking"), TinySpec(variant="qwen3", logit_scale=30.0))
    runs: dict = {"path": path}
    # vLLM's V2 model runner, its default for this model on a GPU, refuses thinking budgets ("not yet
    # supported"); its V1 runner serves them (a WeDLM engine always runs on V1).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}, reasoning_parser="qwen3") as ar:
            runs["end"] = ar.get_tokenizer().encode("</think>", add_special_tokens=False)
            for budget in BUDGETS:
                runs[f"engine_{budget}"] = token_ids(ar.generate(PROMPTS, params(budget), use_tqdm=False))
    return runs


@pytest.fixture(scope="module", params=[False, True], ids=["exact-rows", "fixed-rows"])
def runs(request, ar_runs):
    runs = dict(ar_runs)
    config = {"decoding": "wedlm", "window_size": 8, "fixed_window_rows": request.param}
    with running_llm(runs["path"], dtype="float32", additional_config=config, reasoning_parser="qwen3") as llm:
        runs["plain_alone"] = token_ids(llm.generate(PROMPTS, params(None), use_tqdm=False))
        for budget in BUDGETS[1:]:
            # Every mode with the budget, and a plain request without one, in one batch.
            batch = [params(budget, mode) for _ in PROMPTS for mode in MODES] + [params(None)] * len(PROMPTS)
            outputs = token_ids(llm.generate([p for p in PROMPTS for _ in MODES] + PROMPTS, batch, use_tqdm=False))
            for i, mode in enumerate(MODES):
                runs[f"{mode}_{budget}"] = outputs[i: len(PROMPTS) * len(MODES): len(MODES)]
            runs[f"beside_{budget}"] = outputs[len(PROMPTS) * len(MODES):]
    return runs


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[k: k + len(part)] == part for k in range(len(ids) - len(part) + 1))


@pytest.mark.parametrize("budget", BUDGETS[1:])
def test_every_mode_with_a_budget_equals_the_ar_engine(runs, budget):
    expected = runs[f"engine_{budget}"]
    assert expected != runs["engine_None"]  # the budget changes AR's text ...
    assert all(contains(ids, runs["end"]) for ids in expected)  # ... by ending the thinking
    for mode in MODES:
        assert runs[f"{mode}_{budget}"] == expected, mode


@pytest.mark.parametrize("budget", BUDGETS[1:])
def test_requests_without_a_budget_do_not_change(runs, budget):
    assert runs[f"beside_{budget}"] == runs["plain_alone"]

