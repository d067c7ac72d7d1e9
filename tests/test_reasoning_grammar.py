"""Structured outputs on an engine with a reasoning parser (``--reasoning-parser qwen3``): the grammar
starts where the reasoning ends, as in AR, and WeDLM windows decode both parts.

A lossless window draws its reasoning freely and masks the row after the token that ends it with the
grammar's first mask (``WindowGrammars.masks_along``), so its output equals an ``--decoding ar``
engine's token for token, even when one window's run holds the end of the reasoning and the start of
the answer; the scheduler then advances vLLM's own grammar by the answer's tokens of that run
(``grammar_rows.note_reasoning_end``), or it would reject the next ones and end the request in an
error. A plain window decodes its reasoning as an unconstrained one would, and its answer obeys the
constraint. On exact window rows and on fixed ones (the async engine's). The tiny tokenizer gets
Qwen3's ``<think>`` and ``</think>`` as tokens of their own, as its reasoning parser needs; a logit
bias on ``</think>`` makes the random model end its reasoning part-way, at a different place per
prompt.
"""

from __future__ import annotations

import re

import pytest

from conftest import add_remote_code_sentinels
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec, train_tokenizer, write_checkpoint

# Prompts that open a thinking block, and one whose reasoning has ended in the prompt.
PROMPTS = ["<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n<think>\n",
           "1, 2, 3, 4 <think>", "<|im_start|>user\nThe quiet river<|im_end|>\n<|im_start|>assistant\n<think>\n",
           "Gus <think>", "<|im_start|>user\nGus<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"]
CHOICES = ["yes", "no", "maybe so"]
REGEX = r"[0-9]{2,4}( apples| lamps)?"
CONSTRAINTS = {"choice": {"choice": CHOICES}, "regex": {"regex": REGEX}}
MODES = {"plain": None, "lossless": {"wedlm_lossless": True}, "ar": {"wedlm_decoding": "ar"}, "free": None}
END_BIAS = 14.0  # on "</think>": this random model then ends its reasoning part-way in most prompts
MAX_TOKENS = 40
ENGINE = {"dtype": "float32", "reasoning_parser": "qwen3",
          "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}


def obeys(name: str, answer: str) -> bool:
    return answer in CHOICES if name == "choice" else re.fullmatch(REGEX, answer) is not None


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    spec = TinySpec(variant="qwen3", logit_scale=30.0)
    tokenizer = train_tokenizer(spec.seed, spec.vocab_target)
    tokenizer.add_tokens(["<think>", "</think>"])  # Qwen3's: added tokens, not special ones
    path = write_checkpoint(tmp_path_factory.mktemp("reasoning") / "qwen3-think", tokenizer, spec)
    add_remote_code_sentinels(path)
    return path, tokenizer.token_to_id("</think>")


def params(end: int, constraint: str, mode: str = "plain"):
    """A request of ``mode``: "free" is a plain one without the constraint."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    structured = None if mode == "free" else StructuredOutputsParams(**CONSTRAINTS[constraint])
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logit_bias={end: END_BIAS},
                          structured_outputs=structured, extra_args=MODES[mode])


def answers(outputs) -> list[tuple[list[int], str, str]]:
    return [(list(out.outputs[0].token_ids), out.outputs[0].text, out.outputs[0].finish_reason) for out in outputs]


@pytest.fixture(scope="module")
def ar_runs(model):
    path, end = model
    with running_llm(path, additional_config={"decoding": "ar"}, **ENGINE) as ar:
        return {name: answers(ar.generate(PROMPTS, params(end, name), use_tqdm=False)) for name in CONSTRAINTS}


@pytest.fixture(scope="module", params=[False, True], ids=["exact-rows", "fixed-rows"])
def runs(request, model):
    path, end = model
    runs: dict = {}
    config = {"decoding": "wedlm", "window_size": 8, "fixed_window_rows": request.param}
    with running_llm(path, additional_config=config, **ENGINE) as llm:
        for name in CONSTRAINTS:
            batch = [params(end, name, mode) for _ in PROMPTS for mode in MODES]  # every mode in one batch
            before = sum(llm.collective_rpc("wedlm_request_forwards"))
            outputs = answers(llm.generate([p for p in PROMPTS for _ in MODES], batch, use_tqdm=False))
            runs[f"forwards_{name}"] = sum(llm.collective_rpc("wedlm_request_forwards")) - before  # windows
            for i, mode in enumerate(MODES):
                runs[f"{mode}_{name}"] = outputs[i:: len(MODES)]
    return runs


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_the_ar_engine_reasons_then_answers_under_the_grammar(model, ar_runs, name):
    # The premise of the tests below: vLLM's AR engine ends the reasoning part-way in most prompts,
    # and constrains only what follows.
    end = model[1]
    ends = [ids.index(end) for ids, _, _ in ar_runs[name] if end in ids]
    assert len([at for at in ends if at > 0]) >= 3, ends
    for (_ids, text, reason), prompt in zip(ar_runs[name], PROMPTS, strict=True):
        answer = text.split("</think>")[-1]
        assert reason == "stop" and obeys(name, answer), (prompt, text)


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_lossless_and_per_request_ar_equal_the_ar_engine(ar_runs, runs, name):
    for mode in ("lossless", "ar"):
        assert runs[f"{mode}_{name}"] == ar_runs[name], mode


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_windows_decode_the_reasoning_and_the_answer(runs, name):
    # Not decoded AR: every token of the plain and lossless requests came from a window, at more
    # than one token per window forward.
    windowed = sum(len(ids) for mode in ("plain", "lossless", "free") for ids, _, _ in runs[f"{mode}_{name}"])
    assert 0 < runs[f"forwards_{name}"] < windowed


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_plain_windows_reason_as_unconstrained_ones(model, runs, name):
    # Until a run ends the reasoning, a plain request decodes as one without the grammar beside it.
    end = model[1]
    reasoned = 0
    for (ids, _, _), (free, _, _), prompt in zip(runs[f"plain_{name}"], runs[f"free_{name}"], PROMPTS, strict=True):
        if prompt.endswith("</think>\n\n"):
            assert ids != free  # its reasoning ended in the prompt: the grammar holds from its first token
            continue
        reasoning = ids.index(end) + 1 if end in ids else len(ids)
        assert ids[:reasoning] == free[:reasoning]
        reasoned += reasoning
    assert reasoned > 2 * len(PROMPTS)


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_plain_windows_answer_under_the_grammar(model, runs, name):
    end = model[1]
    ended = 0
    for (ids, text, reason), prompt in zip(runs[f"plain_{name}"], PROMPTS, strict=True):
        assert reason in ("stop", "length"), (prompt, text, reason)  # an error: vLLM's grammar rejected a run
        if end in ids or prompt.endswith("</think>\n\n"):
            ended += 1
            answer = text.split("</think>")[-1]
            assert reason == "stop" and obeys(name, answer), (prompt, text)
    assert ended >= 3
