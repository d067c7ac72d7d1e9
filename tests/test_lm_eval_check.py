"""The lm-eval check's tasks (benchmarks/lm_eval_check.py): local data lm-eval reads, one row per
held-out problem, whose first choice is the right result and whose context stops at the last "="."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.lm_eval_check import GENERATION_TASK, LOGLIKELIHOOD_TASK, write_tasks
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT

pytestmark = pytest.mark.fast


def test_the_tasks_hold_the_held_out_problems(tmp_path):
    write_tasks(str(MICRO_CHECKPOINT), tmp_path, count=12)
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and len({row["question"] for row in rows}) == 12
    for row in rows:
        assert row["context"].startswith(row["question"]) and row["context"].endswith(" =")
        assert row["choices"][0] == f" {row['answer']}" and len(set(row["choices"])) == 4
        assert row["question"].endswith("<|im_start|>assistant\n")  # the model's own chat template
    choice = yaml.safe_load((tmp_path / f"{LOGLIKELIHOOD_TASK}.yaml").read_text())
    generation = yaml.safe_load((tmp_path / f"{GENERATION_TASK}.yaml").read_text())
    assert choice["output_type"] == "multiple_choice" and choice["doc_to_target"] == 0
    assert generation["output_type"] == "generate_until"
    assert generation["generation_kwargs"]["until"] == ["<|im_end|>"]
    for task in (choice, generation):
        assert task["dataset_kwargs"]["data_files"]["test"] == str(tmp_path / "answers.jsonl")
