"""The trained micro model, decoded in vLLM: the evidence that the whole pipeline buys speed.

Two halves, because a CPU training run is deterministic on one machine and not across machines:

* the **shipped checkpoint** (``vllm_wedlm/checkpoints/micro``, the ``micro`` recipe trained once,
  with its training record and evaluation): re-measured here in both modes, it must commit several
  tokens per forward on the low-entropy kinds, keep the arithmetic accuracy of the same weights
  decoded with ``--decoding ar``, and still say what its record says. Greedy decoding of fixed
  weights is stable across machines (the CPU and an H100 agree, both in vLLM's default bf16
  compute for a float32 checkpoint); a training trajectory is not.
* a **short training run** of the same recipe from random weights, here on the CPU: asserts only
  what held for every seed tried (both losses fall far below their start, several tokens per
  forward on arithmetic already), so it is true on any machine.

Every bound comes from six seeds per setting, trained and evaluated on an H100
(``benchmarks/results/h100/micro-seeds.json``, README "Training"); see each constant.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import evaluate_mode, held_out_tasks, trained_max_number
from vllm_wedlm.training.recipes import RECIPES
from vllm_wedlm.training.train import train_from_scratch

PER_KIND = 80  # held-out tasks per kind asked for: one arithmetic task is 0.0125
KINDS = ("counting", "arithmetic")

# The micro recipe at 3,600 steps over six seeds: WeDLM tokens per forward 8.34-9.69 on arithmetic
# and 4.10-4.65 on counting; AR arithmetic accuracy 0.963-1.000; WeDLM trails it by -0.012 to
# 0.075 (at most 6 of 80 tasks). Each bound sits below the worst seed; today's 6,000-step recipe
# measured above all of them (three candidates: 12.2-13.3 and 6.3-6.6 tokens per forward, AR
# arithmetic 1.00, WeDLM 0.99-1.00).
MIN_TOKENS_PER_FORWARD = {"counting": 3.5, "arithmetic": 7.5}
MIN_AR_ARITHMETIC_ACCURACY = 0.9  # the model must really solve them, or "close to AR" means nothing
MAX_ACCURACY_GAP = 0.1  # 8 of 80 tasks
# The same checkpoint, re-measured on another machine: greedy decoding may flip a near-tie, no more.
RECORD_ACCURACY_TOLERANCE = 2 / PER_KIND
RECORD_TPF_TOLERANCE = 0.03  # relative
# The fixed W of the record and of the seeds' bounds: the adaptive window (the engine's default) sizes
# windows from step times, which differ between machines.
RECORD_WINDOW = 16


@pytest.fixture(scope="module")
def tasks():
    """Held-out tasks in the model's own number range (counting below 20 has only 25 of them)."""
    return held_out_tasks(PER_KIND, KINDS, max_number=trained_max_number(str(MICRO_CHECKPOINT)))


@pytest.fixture(scope="module")
def results(tasks) -> dict[str, dict[str, dict]]:
    """{mode: {kind: entry}}: AR first (WeDLM mode switches the process to vLLM's V1 runner)."""
    return {mode: evaluate_mode(str(MICRO_CHECKPOINT), mode, tasks, window_size=RECORD_WINDOW)
            for mode in ("ar", "wedlm")}


def test_the_micro_model_answers_every_held_out_task_in_both_modes(tasks, results):
    assert len(tasks["arithmetic"]) == PER_KIND and len(tasks["counting"]) >= 20
    for mode in ("ar", "wedlm"):
        for kind in KINDS:
            assert results[mode][kind]["requests"] == len(tasks[kind])
            assert results[mode][kind]["output_tokens"] > 4 * len(tasks[kind])  # it answers, not just stops
    assert results["ar"]["arithmetic"]["tokens_per_forward"] == 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_wedlm_commits_several_tokens_per_forward(results, kind):
    tpf = results["wedlm"][kind]["tokens_per_forward"]
    assert tpf >= MIN_TOKENS_PER_FORWARD[kind], results["wedlm"][kind]


def test_wedlm_keeps_the_arithmetic_accuracy_of_the_same_weights_decoded_ar(results):
    ar, wedlm = results["ar"]["arithmetic"]["accuracy"], results["wedlm"]["arithmetic"]["accuracy"]
    assert ar >= MIN_AR_ARITHMETIC_ACCURACY, results["ar"]["arithmetic"]
    assert wedlm >= ar - MAX_ACCURACY_GAP, (ar, wedlm, results["wedlm"]["arithmetic"]["samples"])


def test_the_shipped_checkpoint_is_what_its_record_says(results):
    """The recipe in its training record is today's ``micro`` recipe, and its recorded held-out
    evaluation (same tasks, same engine settings) is what this machine measures."""
    record = json.loads((MICRO_CHECKPOINT / "training.json").read_text())
    recipe = RECIPES["micro"]
    assert record["recipe"]["name"] == recipe.name
    for name in ("steps", "batch_size", "suffix_mask_prob", "mlm_weighting", "max_number", "task_counts", "oversample"):
        assert record["recipe"][name] == getattr(recipe, name), name
    assert record["history"][-1]["step"] == recipe.steps
    recorded = json.loads((MICRO_CHECKPOINT / "evaluation.json").read_text())
    assert recorded["per_kind"] == PER_KIND
    for mode in ("ar", "wedlm"):
        for kind in KINDS:
            now, then = results[mode][kind], recorded["modes"][mode][kind]
            assert now["requests"] == then["requests"]
            assert abs(now["accuracy"] - then["accuracy"]) <= RECORD_ACCURACY_TOLERANCE + 1e-9, (mode, kind, now, then)
            rel = abs(now["tokens_per_forward"] - then["tokens_per_forward"]) / then["tokens_per_forward"]
            assert rel <= RECORD_TPF_TOLERANCE, (mode, kind, now["tokens_per_forward"], then["tokens_per_forward"])


# A short run of the same recipe (600 steps; the recipe has 6,000), six seeds: the logged loss fell from
# 4.89-4.92 to 0.16-0.21 (MLM 0.23-0.29, AR 0.08-0.14); held-out WeDLM arithmetic 2.37-3.47 tokens
# per forward at accuracy 0.525-0.662. The bounds hold for any trajectory of the recipe.
SHORT_STEPS = 600
MAX_FINAL_LOSS = {"mlm": 0.6, "ar": 0.4}
MIN_SHORT_ARITHMETIC_TPF = 1.8
MIN_SHORT_ARITHMETIC_ACCURACY = 0.35


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    recipe = replace(RECIPES["micro"], steps=SHORT_STEPS)
    return train_from_scratch(tmp_path_factory.mktemp("micro-short"), recipe, torch.device("cpu"))


def test_a_short_training_run_learns_on_this_machine(short_run, tasks):
    history = json.loads((short_run / "training.json").read_text())["history"]
    first, last = history[0], history[-1]
    assert last["step"] == SHORT_STEPS
    for loss, bound in MAX_FINAL_LOSS.items():
        assert last[loss] <= bound and last[loss] <= first[loss] / 8, (loss, first[loss], last[loss])
    wedlm = evaluate_mode(str(short_run), "wedlm", {"arithmetic": tasks["arithmetic"]})["arithmetic"]
    assert wedlm["tokens_per_forward"] >= MIN_SHORT_ARITHMETIC_TPF, wedlm
    assert wedlm["accuracy"] >= MIN_SHORT_ARITHMETIC_ACCURACY, wedlm
