"""Data-parallel training (torchrun, DDP over gloo on the CPU) computes what one process computes.

Two processes each take half of a global batch; their averaged gradient must be the single-process
gradient of the whole batch, up to floating-point order, for both MLM weightings (each share's loss
is normalised by the whole batch's counts). A share's own gradient is checked to differ, so the
comparison could fail. Then the training command itself under torchrun: one log, one checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from ddp_gradients import gradients, model_and_batch
from vllm_wedlm.training.distributed import ONE_PROCESS, Ranks, backward_step, data_parallel, share
from vllm_wedlm.training.recipes import MLM_WEIGHTINGS

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def one_process(mlm_weighting: str, ranks: Ranks = ONE_PROCESS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradients and losses of one process; with ``ranks``, of that rank's share alone (no DDP)."""
    model, batch = model_and_batch()
    forward = data_parallel(model, 1.0, mlm_weighting, ONE_PROCESS)
    if ranks is not ONE_PROCESS:
        batch = share(batch, ranks)
    losses = backward_step(forward, batch, mlm_weighting, ONE_PROCESS, torch.device("cpu"), nullcontext())
    return gradients(model), losses.detach()


@pytest.mark.parametrize("mlm_weighting", MLM_WEIGHTINGS)
def test_two_gloo_processes_give_the_single_process_gradient(tmp_path, mlm_weighting):
    out = tmp_path / "ddp.pt"
    run = subprocess.run([*TORCHRUN, "tests/ddp_gradients.py", str(out), mlm_weighting], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    ddp = torch.load(out)
    assert ddp["world_size"] == 2
    expected, losses = one_process(mlm_weighting)
    assert expected.keys() == ddp["gradients"].keys() and len(expected) > 10
    for name, grad in expected.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(ddp["gradients"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
    torch.testing.assert_close(ddp["losses"], losses, rtol=1e-5, atol=1e-7)
    # Half the batch alone has another gradient: the match above is the two halves together.
    half, _ = one_process(mlm_weighting, Ranks(rank=0, world_size=2))
    assert any(not torch.allclose(half[name], grad, rtol=1e-3, atol=1e-6) for name, grad in expected.items())


def test_the_training_command_under_torchrun_writes_one_checkpoint(tmp_path):
    out = tmp_path / "model"
    run = subprocess.run([*TORCHRUN, "-m", "vllm_wedlm.training", str(out), "--recipe", "micro", "--steps", "2",
                          "--batch-size", "4", "--tasks", "arithmetic=64,counting=16", "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("training micro:") == 1 and "x2 data-parallel processes" in run.stderr  # rank 0 only
    assert run.stdout.strip().splitlines()[-1] == str(out)
    record = json.loads((out / "training.json").read_text())
    assert record["trained_on"]["processes"] == 2 and record["history"][-1]["step"] == 2
    assert (out / "model.safetensors").is_file()
