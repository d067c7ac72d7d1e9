"""WeDLM's dual-stream masking (research/wedlm.md section 5), for one sample at a time.

A training sample of L tokens becomes a 2L-token sequence:

* the **memory stream** (indices 0..L-1): the clean tokens at positions 0..L-1, read causally;
  it carries the auxiliary next-token (AR) loss;
* the **prediction stream** (indices L..2L-1): the same tokens cut into blocks of B; in each block
  a fraction gamma ~ U(0, 1) of the maskable (response) tokens is replaced by the mask token, and
  the block is reordered topologically: observed tokens first, then masks, each keeping its
  logical position (RoPE). A mask row is trained to predict the token at its own position (no
  shift), which is how inference fills a mask from its own row's logits.

Attention (True = may attend): inside a block of one stream, causal in physical order; a
prediction query sees the memory stream of strictly earlier blocks; the memory stream is plain
causal. So a prediction block sees exactly what an inference window sees: the clean committed
prefix, then the window's own reordered tokens causally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


@dataclass(frozen=True)
class DualStreamSample:
    """One masked sample, all tensors of length 2L (memory stream, then prediction stream)."""

    input_ids: torch.Tensor  # [2L] long
    position_ids: torch.Tensor  # [2L] long, logical positions (0..L-1 twice, prediction reordered)
    mlm_targets: torch.Tensor  # [2L] long, the original token at masked prediction rows, else IGNORE
    mlm_weights: torch.Tensor  # [2L] float, 1/gamma of the row's block at masked rows, else 0
    ar_targets: torch.Tensor  # [2L] long, the next token at memory rows whose next token is a response token


def mask_blocks(
    input_ids: torch.Tensor,  # [L] long
    maskable: torch.Tensor,  # [L] bool, False for prompt tokens (never masked)
    block_size: int,
    mask_token_id: int,
    generator: torch.Generator,
    *,
    mask_eps: float = 1e-8,
    gammas: torch.Tensor | None = None,  # [num_blocks] float, drawn from U(0, 1) when None
    suffix_prob: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask and reorder the prediction stream.

    ``suffix_prob``: the chance that a block masks the *last* ``count`` maskable tokens (a
    contiguous tail) instead of a uniformly random subset of them. A tail is what an inference
    window mostly looks like (everything left of the first mask is known), and it is the only
    pattern in which a mask always sees the whole left context of its own block; random subsets
    rarely leave, say, both operands of a sum visible to the mask of its result.

    Returns (tokens [L], positions [L], targets [L], weights [L]) in physical order: per block the
    observed tokens in logical order, then the masks in logical order.
    """
    length = input_ids.numel()
    num_blocks = -(-length // block_size)
    if gammas is None:
        gammas = torch.rand(num_blocks, generator=generator, dtype=torch.float64)
    gammas = gammas.to(torch.float64).clamp(min=mask_eps)
    tokens, positions, targets, weights = [], [], [], []
    for block in range(num_blocks):
        start, end = block * block_size, min((block + 1) * block_size, length)
        candidates = torch.nonzero(maskable[start:end]).flatten() + start  # [n] logical positions
        count = int(torch.round(gammas[block] * candidates.numel()).item())
        # The extra draw only happens when tails are asked for, so recipes without them keep
        # their random stream (and their trained weights) unchanged.
        if suffix_prob > 0 and float(torch.rand((), generator=generator, dtype=torch.float64)) < suffix_prob:
            chosen = candidates[candidates.numel() - count:]
        else:
            chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:count]]
        is_mask = torch.zeros(end - start, dtype=torch.bool)
        is_mask[chosen - start] = True
        logical = torch.arange(start, end)
        order = torch.cat([logical[~is_mask], logical[is_mask]])  # stable: observed, then masks
        masked_here = is_mask[order - start]
        tokens.append(torch.where(masked_here, torch.tensor(mask_token_id), input_ids[order]))
        positions.append(order)
        targets.append(torch.where(masked_here, input_ids[order], torch.tensor(IGNORE)))
        weights.append(masked_here.to(torch.float32) / float(gammas[block]))
    return torch.cat(tokens), torch.cat(positions), torch.cat(targets), torch.cat(weights)


def dual_stream_attention_mask(length: int, block_size: int) -> torch.Tensor:
    """The [2L, 2L] bool mask (True = may attend) of a dual-stream sample of L tokens."""
    index = torch.arange(2 * length)
    is_prediction = index >= length  # [2L]
    block = (index % length) // block_size  # [2L] block of each physical index, per stream
    q_pred, k_pred = is_prediction[:, None], is_prediction[None, :]
    q_block, k_block = block[:, None], block[None, :]
    causal = index[None, :] <= index[:, None]
    same_stream_block = (q_pred == k_pred) & (q_block == k_block) & causal
    memory_to_memory = ~q_pred & ~k_pred & (k_block < q_block)
    prediction_to_memory = q_pred & ~k_pred & (k_block < q_block)
    return same_stream_block | memory_to_memory | prediction_to_memory


def dual_stream_sample(
    input_ids: torch.Tensor,  # [L] long
    maskable: torch.Tensor,  # [L] bool
    block_size: int,
    mask_token_id: int,
    generator: torch.Generator,
    *,
    mask_eps: float = 1e-8,
    suffix_prob: float = 0.0,
) -> DualStreamSample:
    """The full 2L-token training sample of one tokenised chat."""
    length = input_ids.numel()
    tokens, positions, targets, weights = mask_blocks(
        input_ids, maskable, block_size, mask_token_id, generator, mask_eps=mask_eps, suffix_prob=suffix_prob
    )
    # Memory row i predicts token i+1 when that token carries loss (a response token).
    next_ids = torch.cat([input_ids[1:], torch.tensor([IGNORE])])
    next_maskable = torch.cat([maskable[1:], torch.tensor([False])])
    ar_memory = torch.where(next_maskable, next_ids, torch.tensor(IGNORE))
    return DualStreamSample(
        input_ids=torch.cat([input_ids, tokens]),
        position_ids=torch.cat([torch.arange(length), positions]),
        mlm_targets=torch.cat([torch.full((length,), IGNORE), targets]),
        mlm_weights=torch.cat([torch.zeros(length), weights]),
        ar_targets=torch.cat([ar_memory, torch.full((length,), IGNORE)]),
    )
