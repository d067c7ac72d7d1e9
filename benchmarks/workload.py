"""The prompts of a run: held-out chat tasks from low to high entropy, optionally lengthened.

Tasks come from the training module's generator (held-out split), so a model trained with
``vllm_wedlm.training`` is measured on prompts it never saw, and answers of counting and
arithmetic tasks can be checked. ``shots`` prepends that many solved training-split tasks of the
same kind as earlier chat turns: the same question with a longer prompt (the prompt-length sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_wedlm.evaluation import is_correct
from vllm_wedlm.training.data.tasks import KINDS, MAX_NUMBER, Task, generate


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
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown task kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    prompts = {}
    for kind in kinds:
        examples = generate(kind, "train", shots, seed, max_number) if shots else []
        history = [m for example in examples for m in example.messages()]
        prompts[kind] = [
            Prompt(kind, tokenizer.apply_chat_template(history + task.messages(with_response=False),
                                                       add_generation_prompt=True, tokenize=False), task)
            for task in generate(kind, "test", count, seed, max_number)
        ]
    return prompts


def take(prompts: list[Prompt], n: int) -> list[Prompt]:
    """``n`` prompts, cycling when the pool is smaller (repeats are then served from the prefix cache)."""
    return [prompts[i % len(prompts)] for i in range(n)]
