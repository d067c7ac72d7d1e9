"""Structured outputs in WeDLM mode (adapter/grammar_rows.py) with a choice, a regex, a JSON schema or
a grammar. A per-request AR request is decoded AR under vLLM's own grammar masks, so it gives
exactly what an ``--decoding ar`` engine gives. A lossless request decodes in windows whose
verification rows are masked along the run, on exact window rows and on fixed ones (the async
engine's), which must give the AR engine's output too, token for token; a plain one decodes in
windows under the grammar: its output obeys the constraint. Unconstrained WeDLM requests beside
them do not change. tests/test_grammar_windows.py has windows under a grammar on the trained micro
model, and fixed rows equal to exact ones there."""

from __future__ import annotations

import json
import re

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec

MAX_TOKENS = 24
PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
CHOICES = ["yes", "no", "maybe so"]
REGEX = r"[0-9]{2,4}( apples| lamps)?"
SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                                           "count": {"type": "integer", "enum": [1, 2, 3]}},
          "required": ["colour", "count"], "additionalProperties": False}
GRAMMAR = 'root ::= "A" rest\nrest ::= "b" rest | "c"'
CONSTRAINTS = {"choice": {"choice": CHOICES}, "regex": {"regex": REGEX}, "json": {"json": SCHEMA},
               "grammar": {"grammar": GRAMMAR}}
MODES = {"plain": None, "lossless": {"wedlm_lossless": True}, "ar": {"wedlm_decoding": "ar"}}
CASES = [("qwen3", False), ("qwen2", False), ("qwen3", True)]  # (variant, fixed window rows)
# No free whitespace in JSON (an engine-wide setting of vLLM's): a random model fills its budget with it.
ENGINE = {"dtype": "float32", "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}


def params(constraint: str | None, mode: str = "plain", max_tokens: int = MAX_TOKENS):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    structured = StructuredOutputsParams(**CONSTRAINTS[constraint]) if constraint else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=constraint is None,
                          structured_outputs=structured, extra_args=MODES[mode])


def texts(outputs) -> list[tuple[str, list[int]]]:
    return [(out.outputs[0].text, list(out.outputs[0].token_ids)) for out in outputs]


@pytest.fixture(scope="module", params=CASES, ids=[f"{v}{'-fixed-rows' if f else ''}" for v, f in CASES])
def runs(request, tmp_path_factory):
    variant, fixed_rows = request.param
    path = build_checkpoint(tmp_path_factory.mktemp("structured"), TinySpec(variant=variant, logit_scale=30.0))
    runs: dict = {}
    budget = {"json": 64}  # room to close the object
    with running_llm(path, additional_config={"decoding": "ar"}, **ENGINE) as ar:
        for name in CONSTRAINTS:
            runs[f"engine_{name}"] = texts(ar.generate(PROMPTS, params(name, max_tokens=budget.get(name, MAX_TOKENS)),
                                                       use_tqdm=False))
    config = {"decoding": "wedlm", "window_size": 8, "fixed_window_rows": fixed_rows}
    with running_llm(path, additional_config=config, **ENGINE) as llm:
        runs["free"] = texts(llm.generate(PROMPTS, params(None), use_tqdm=False))
        for name in CONSTRAINTS:
            # Every mode with the constraint, and unconstrained plain requests, in one batch.
            kinds = [*MODES, "free"]
            batch = [params(None) if kind == "free" else params(name, kind, budget.get(name, MAX_TOKENS))
                     for _ in PROMPTS for kind in kinds]
            outputs = texts(llm.generate([p for p in PROMPTS for _ in kinds], batch, use_tqdm=False))
            for i, kind in enumerate(kinds):
                runs[f"{kind}_{name}"] = outputs[i::len(kinds)]
    return runs


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_lossless_and_ar_modes_give_the_ar_engines_constrained_output(runs, name):
    for mode in ("lossless", "ar"):
        assert runs[f"{mode}_{name}"] == runs[f"engine_{name}"], mode
    assert runs[f"free_{name}"] == runs["free"]  # unconstrained requests beside them do not change


@pytest.mark.parametrize("source", ["engine", *MODES])
def test_the_outputs_obey_their_constraints(runs, source):
    assert all(text in CHOICES for text, _ in runs[f"{source}_choice"])
    assert all(re.fullmatch(REGEX, text) for text, _ in runs[f"{source}_regex"])
    # A grammar the model may keep open ("b" forever): closed, or a valid prefix cut by max_tokens.
    assert all(re.fullmatch("Ab*c", text) or (re.fullmatch("Ab*", text) and len(ids) == MAX_TOKENS)
               for text, ids in runs[f"{source}_grammar"])
    for text, _ in runs[f"{source}_json"]:
        value = json.loads(text)
        assert value["colour"] in SCHEMA["properties"]["colour"]["enum"] and value["count"] in (1, 2, 3)
    assert [text for text, _ in runs["free"]] != [text for text, _ in runs[f"{source}_choice"]]
