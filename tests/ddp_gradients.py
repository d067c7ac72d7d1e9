"""One training step's gradients under torchrun, for tests/test_distributed_training.py.

    torchrun --standalone --nproc-per-node 2 tests/ddp_gradients.py OUT.pt WEIGHTING

Every process builds the same tiny model and global batch (:func:`model_and_batch`), runs the
backward step that ``train()`` runs (``data_parallel`` + ``backward_step``, so DDP over gloo), and
rank 0 saves the gradients and the batch's summed losses.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from vllm_wedlm.training.distributed import backward_step, data_parallel, finish, start, sum_over_ranks
from vllm_wedlm.training.objective import Batch, collate

VOCAB, MASK, PAD = 64, 63, 0


def model_and_batch() -> tuple[torch.nn.Module, Batch]:
    """A tiny Qwen3 model and a global batch of 4 chats of different lengths (the same in every process)."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                         attn_implementation="sdpa")
    model = Qwen3ForCausalLM(config).float()
    samples = []
    for length, prompt in ((20, 5), (14, 4), (17, 6), (11, 3)):
        ids = torch.randint(1, MASK, (length,))
        samples.append((ids, torch.arange(length) >= prompt))
    batch = collate(samples, block_size=8, mask_token_id=MASK, pad_token_id=PAD,
                    generator=torch.Generator().manual_seed(0), suffix_prob=0.5)
    return model, batch


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def one_step(mlm_weighting: str, ranks, device: torch.device) -> dict:
    """The gradients and summed losses of one data-parallel step (this process's copy)."""
    model, batch = model_and_batch()
    forward = data_parallel(model, 1.0, mlm_weighting, ranks)
    losses = sum_over_ranks(backward_step(forward, batch, mlm_weighting, ranks, device, nullcontext()), ranks)
    return {"gradients": gradients(model), "losses": losses, "world_size": ranks.world_size}


def main(out: str, mlm_weighting: str) -> None:
    ranks, device = start("cpu")
    # The DDP wrapper is gone (one_step returned) before the process group is: destroyed after it,
    # its reducer hung now and then at exit (gloo), as training's order (train() returns first) avoids.
    result = one_step(mlm_weighting, ranks, device)
    if ranks.main:
        torch.save(result, out)
    finish(ranks)


if __name__ == "__main__":
    main(*sys.argv[1:])
