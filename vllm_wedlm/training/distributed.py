"""Data-parallel training through torch.distributed: one process per GPU (or per CPU share), started
by torchrun, with DistributedDataParallel averaging the gradients.

    torchrun --nproc-per-node 4 -m vllm_wedlm.training OUT --recipe small

Every process builds the same model and, each step, the same global batch of ``recipe.batch_size``
chats (the same seeds, so the same masks), and trains on its own contiguous share of those chats.
Each share's loss is normalised by the whole batch's counts (the MLM rows' weights, the AR rows),
so the gradients DDP averages add up to the single-process gradient of the whole batch, up to
floating-point order (tests/test_distributed_training.py). Rank 0 logs and writes the checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from vllm_wedlm.training.objective import Batch, LossNormalizers, wedlm_losses


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


ONE_PROCESS = Ranks()


def pick_device(name: str | None, local_rank: int = 0) -> torch.device:
    """``name`` if given, else this process's GPU (cuda:LOCAL_RANK under torchrun) where there are
    GPUs, else the CPU."""
    if name:
        return torch.device(name)
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def start(device: str | None) -> tuple[Ranks, torch.device]:
    """Join torchrun's process group when started by torchrun with several processes, and choose this
    process's device (:func:`pick_device`)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    ranks = Ranks(int(os.environ.get("RANK", "0")), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    chosen = pick_device(device, ranks.local_rank)
    if world_size > 1:
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        dist.init_process_group("nccl" if chosen.type == "cuda" else "gloo")
    return ranks, chosen


def finish(ranks: Ranks) -> None:
    """Leave the process group once every process is done (rank 0 has written the checkpoint)."""
    if ranks.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


class LossModule(torch.nn.Module):
    """The model and WeDLM's loss as one module: DistributedDataParallel must see the whole forward
    (the loss calls the model's body and its LM head separately)."""

    def __init__(self, model: torch.nn.Module, ar_weight: float, mlm_weighting: str):
        super().__init__()
        self.model = model
        self.ar_weight = ar_weight
        self.mlm_weighting = mlm_weighting

    def forward(self, batch: Batch, normalizers: LossNormalizers | None = None) -> torch.Tensor:
        losses = wedlm_losses(self.model, batch, self.ar_weight, self.mlm_weighting, normalizers)
        return torch.stack([losses.total, losses.mlm, losses.ar])  # [3]


def data_parallel(model: torch.nn.Module, ar_weight: float, mlm_weighting: str, ranks: Ranks) -> torch.nn.Module:
    """The module a training step calls: the model and its loss, in DDP when several processes train."""
    loss_module = LossModule(model, ar_weight, mlm_weighting)
    return DistributedDataParallel(loss_module) if ranks.world_size > 1 else loss_module


def backward_step(forward: torch.nn.Module, batch: Batch, mlm_weighting: str, ranks: Ranks, device: torch.device,
             autocast) -> torch.Tensor:
    """Forward this process's share of the global ``batch`` (on the CPU; every process has the same)
    and backpropagate: afterwards every process holds the whole batch's gradient. Returns the share's
    losses [3] (total, mlm, ar): the whole batch's with one process, else parts that sum to them."""
    normalizers = LossNormalizers.of(batch, mlm_weighting) if ranks.world_size > 1 else None
    with autocast:
        losses = forward(share(batch, ranks).to(device), normalizers)  # [3]
    # DDP averages the gradients over the processes: world_size times a share's part of the whole
    # batch's loss makes that average the whole batch's gradient.
    (losses[0] * ranks.world_size).backward()
    return losses


def share(batch: Batch, ranks: Ranks) -> Batch:
    """This process's contiguous share of the global batch's chats."""
    per_rank = batch.input_ids.shape[0] // ranks.world_size
    return batch.rows(slice(ranks.rank * per_rank, (ranks.rank + 1) * per_rank))


def sum_over_ranks(values: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """``values`` summed over every process (a copy; one process: the values)."""
    values = values.detach().clone()
    if ranks.world_size > 1:
        dist.all_reduce(values)
    return values


def any_rank(flag: bool, ranks: Ranks, device: torch.device) -> bool:
    """Whether ``flag`` holds on some process: every process takes the same decision (a time limit)."""
    if ranks.world_size == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
