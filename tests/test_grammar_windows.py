"""WeDLM windows under a structured output's grammar (adapter/grammar_rows.py), on the trained
micro model, whose fills mean something: every output obeys its constraint, at any window size,
greedy or sampled, beside unconstrained and lossless requests (which do not change); and where the
constraint is the model's own format, windows still commit many tokens per forward. A constraint
the model does not follow (another wording) makes the grammar reject fills, which become masks
again: the output still obeys it."""

from __future__ import annotations

import json
import re

import pytest

from engines import running_llm
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import held_out_tasks, request_forwards, trained_max_number
from vllm_wedlm.training.data.tasks import ARITHMETIC_RESPONSE, chat_prompt, final_answer

# The micro model's own arithmetic format, and the same with a word it never writes there.
OWN_FORMAT = ARITHMETIC_RESPONSE
OTHER_WORD = OWN_FORMAT.replace("answer", "result")
COUNTING = r"([A-Z]|[0-9]+)(, ([A-Z]|[0-9]+))*\."
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "sure": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer", "sure"], "additionalProperties": False}
CHOICES = ["The answer is small.", "The answer is large.", "I cannot tell."]
MAX_TOKENS = 128
PER_KIND = 12


def params(structured: dict | None = None, **overrides):
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, **overrides},
                          structured_outputs=StructuredOutputsParams(**structured) if structured else None)


def obeys(name: str, text: str) -> bool:
    if name == "json":
        value = json.loads(text)
        return 0 <= value["answer"] <= 999 and value["sure"] in ("yes", "no") and set(value) == {"answer", "sure"}
    if name == "choice":
        return text in CHOICES
    return re.fullmatch({"own": OWN_FORMAT, "other": OTHER_WORD, "counting": COUNTING}[name], text) is not None


CONSTRAINTS = {"own": ("arithmetic", {"regex": OWN_FORMAT}), "other": ("arithmetic", {"regex": OTHER_WORD}),
               "counting": ("counting", {"regex": COUNTING}), "json": ("arithmetic", {"json": SCHEMA}),
               "choice": ("arithmetic", {"choice": CHOICES})}


@pytest.fixture(scope="module", params=[16, 4], ids=["W16", "W4"])
def runs(request):
    """{name: (texts, tokens per forward)} for each constraint, greedy and sampled, and unconstrained
    (alone, then in one batch with every constrained and a lossless request)."""
    tasks = held_out_tasks(PER_KIND, ("arithmetic", "counting"), max_number=trained_max_number(str(MICRO_CHECKPOINT)))
    config = {"decoding": "wedlm", "window_size": request.param}
    # No free whitespace in JSON (an engine-wide setting of vLLM's): the model never saw JSON, and
    # would fill its budget with it.
    with running_llm(MICRO_CHECKPOINT, dtype="bfloat16", additional_config=config,
                     structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True}) as llm:
        tokenizer = llm.get_tokenizer()
        prompts = {kind: [chat_prompt(tokenizer, task) for task in tasks[kind]] for kind in tasks}

        def run(kind: str, sampling) -> tuple[list[str], float]:
            before = request_forwards(llm)
            outputs = llm.generate(prompts[kind], sampling, use_tqdm=False)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            return [o.outputs[0].text for o in outputs], tokens / (request_forwards(llm) - before)

        runs = {"free": run("arithmetic", params()), "tasks": tasks}
        for name, (kind, structured) in CONSTRAINTS.items():
            runs[name] = run(kind, params(structured))
            runs[f"sampled_{name}"] = run(kind, params(structured, temperature=0.8, seed=7))
        for name in ("own", "json"):  # lossless windows: AR rows under the grammar verify the fills
            runs[f"lossless_{name}"] = run("arithmetic", params(CONSTRAINTS[name][1],
                                                                extra_args={"wedlm_lossless": True}))
        # One batch: each arithmetic prompt unconstrained, lossless, and under each arithmetic constraint.
        names = [name for name, (kind, _) in CONSTRAINTS.items() if kind == "arithmetic"]
        batch = [params(), params(extra_args={"wedlm_lossless": True})] + [params(CONSTRAINTS[n][1]) for n in names]
        mixed = llm.generate([p for p in prompts["arithmetic"] for _ in batch], batch * PER_KIND, use_tqdm=False)
        texts = [o.outputs[0].text for o in mixed]
        runs["mixed_free"] = texts[0::len(batch)]
        runs["mixed"] = {name: texts[2 + i::len(batch)] for i, name in enumerate(names)}
    return runs


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_every_output_obeys_its_constraint(runs, name):
    for texts in (runs[name][0], runs[f"sampled_{name}"][0], runs["mixed"].get(name, [])):
        assert all(obeys(name, text) for text in texts), texts


def test_unconstrained_requests_beside_them_do_not_change(runs):
    assert runs["mixed_free"] == runs["free"][0]


def test_the_models_own_format_keeps_many_tokens_per_forward(runs):
    """Under its own format the model's fills are what the grammar accepts: windows commit about as
    many tokens per forward as without it (measured: 12.3 vs 11.6 at W 16, 3.9 vs 3.8 at W 4), and
    the answers stay right."""
    free_tpf, own_tpf = runs["free"][1], runs["own"][1]
    assert own_tpf >= 0.8 * free_tpf and own_tpf > 3.0, (own_tpf, free_tpf)
    right = [final_answer(text) == task.answer for text, task in zip(runs["own"][0], runs["tasks"]["arithmetic"],
                                                                       strict=True)]
    free_right = [final_answer(text) == task.answer for text, task in zip(runs["free"][0],
                                                                           runs["tasks"]["arithmetic"], strict=True)]
    assert sum(right) >= sum(free_right) - 1


def test_lossless_windows_under_a_grammar_obey_it_and_keep_the_models_own_format_fast(runs):
    """A lossless window's verification rows are masked along its run (tests/test_structured_outputs.py
    checks that its output is AR's, token for token): every output obeys the constraint, and under
    the model's own format its fills pass, so it commits several tokens per forward."""
    for name in ("own", "json"):
        assert all(obeys(name, text) for text in runs[f"lossless_{name}"][0]), name
        assert runs[f"lossless_{name}"][1] >= 1.0, name
    assert runs["lossless_own"][1] > 2.0, runs["lossless_own"][1]


def test_a_grammar_commits_at_least_one_token_per_forward(runs):
    """The first undecided slot is drawn under the grammar and always filled: even where most fills
    are rejected (JSON, which the model never saw), no window step returns nothing."""
    for name in CONSTRAINTS:
        assert runs[name][1] >= 1.0, name


def test_windows_under_a_grammar_survive_preemption():
    """A batch larger than the KV cache (float32): vLLM preempts requests mid-answer and re-prefills
    them. Their windows and the runner's grammars stay as they were, so each output is the one the
    same engine gives with room for all, and obeys the format."""
    from engines import kv_bytes_per_token
    from vllm_wedlm.models.configuration_wedlm import WeDLMConfig

    tasks = held_out_tasks(8, ("arithmetic",), max_number=trained_max_number(str(MICRO_CHECKPOINT)))["arithmetic"]
    max_model_len = 256
    bytes_per_token = kv_bytes_per_token(WeDLMConfig.from_pretrained(str(MICRO_CHECKPOINT)))
    texts = []
    for kv_tokens in (16 * max_model_len, 2 * max_model_len):
        # (a fixed W: the two engines' outputs are compared, which the adaptive window lets timing change)
        with running_llm(MICRO_CHECKPOINT, dtype="float32", additional_config={"decoding": "wedlm", "window_size": 16},
                         max_model_len=max_model_len, kv_cache_memory_bytes=kv_tokens * bytes_per_token,
                         block_size=16, disable_log_stats=False) as llm:
            prompts = [chat_prompt(llm.get_tokenizer(), task) for task in tasks]
            outputs = llm.generate(prompts, params({"regex": OWN_FORMAT}), use_tqdm=False)
            preemptions = next(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        texts.append([o.outputs[0].text for o in outputs])
        assert (preemptions > 0) == (kv_tokens < 16 * max_model_len), preemptions
    assert texts[1] == texts[0]
    assert all(obeys("own", text) for text in texts[1])


def test_fixed_window_rows_give_the_exact_rows_output():
    """Fixed window rows (the async engine's layout: a window's rows come from the device table, so
    the host never knows where its first mask is) mask that mask's row and cut each run where the
    grammar rejects a fill on the device's say, as exact rows do on the host's: greedy output is
    the same, token for token, plain and lossless, where the grammar takes the model's fills (its
    own format) and where it rejects most of them (another word, JSON), in one mixed batch with
    unconstrained requests; and under its own format windows still commit several tokens per forward."""
    tasks = held_out_tasks(PER_KIND, ("arithmetic",), max_number=trained_max_number(str(MICRO_CHECKPOINT)))
    kinds = [(name, lossless) for name in ("own", "other", "json") for lossless in (False, True)] + [(None, False)]
    outputs = {}
    for fixed_rows in (False, True):
        config = {"decoding": "wedlm", "window_size": 8, "fixed_window_rows": fixed_rows}
        with running_llm(MICRO_CHECKPOINT, dtype="float32", additional_config=config,
                         structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True}) as llm:
            prompts = [chat_prompt(llm.get_tokenizer(), task) for task in tasks["arithmetic"]]
            before = request_forwards(llm)
            own = llm.generate(prompts, params(CONSTRAINTS["own"][1]), use_tqdm=False)
            tokens_per_forward = sum(len(o.outputs[0].token_ids) for o in own) / (request_forwards(llm) - before)
            batch = [params(CONSTRAINTS[name][1] if name else None, extra_args={"wedlm_lossless": lossless})
                     for name, lossless in kinds]
            mixed = llm.generate([p for p in prompts for _ in kinds], batch * len(prompts), use_tqdm=False)
        outputs[fixed_rows] = ([list(o.outputs[0].token_ids) for o in own],
                               [list(o.outputs[0].token_ids) for o in mixed])
        assert tokens_per_forward > 3.0, (fixed_rows, tokens_per_forward)
        for k, (name, _) in enumerate(kinds):
            texts = [o.outputs[0].text for o in mixed[k::len(kinds)]]
            assert name is None or all(obeys(name, text) for text in texts), (fixed_rows, name, texts)
    assert outputs[True] == outputs[False]
