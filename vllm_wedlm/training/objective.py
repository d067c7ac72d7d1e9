"""Batches of dual-stream samples and WeDLM's training loss on a transformers Qwen model.

The model is transformers' own Qwen2/Qwen3 causal LM run with an explicit 4-D boolean attention
mask (its SDPA path hands it to ``torch.nn.functional.scaled_dot_product_attention`` unchanged)
and explicit logical ``position_ids``; nothing of the layer stack is re-implemented.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_wedlm.training.masking import IGNORE, dual_stream_attention_mask, dual_stream_sample


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [N, 2L] long
    position_ids: torch.Tensor  # [N, 2L] long
    attention_mask: torch.Tensor  # [N, 1, 2L, 2L] bool, True = may attend
    mlm_targets: torch.Tensor  # [N, 2L] long, IGNORE where no MLM loss
    mlm_weights: torch.Tensor  # [N, 2L] float
    ar_targets: torch.Tensor  # [N, 2L] long, IGNORE where no AR loss

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})

    def rows(self, index: slice) -> Batch:
        """Some of the batch's samples (a data-parallel process's share)."""
        return Batch(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})


@dataclass(frozen=True)
class LossNormalizers:
    """What a whole batch's losses divide by. Given to a share of the batch, its losses are partial
    sums of the whole batch's, so that the shares' gradients add up to the whole batch's."""

    mlm: float  # the masked rows' summed weight
    ar: float  # the AR rows

    @classmethod
    def of(cls, batch: Batch, mlm_weighting: str) -> LossNormalizers:
        mlm_rows = batch.mlm_targets != IGNORE
        mlm = batch.mlm_weights[mlm_rows].sum().item() if mlm_weighting == "inverse_gamma" else mlm_rows.sum().item()
        return cls(mlm=float(mlm), ar=float((batch.ar_targets != IGNORE).sum().item()))


@dataclass(frozen=True)
class Losses:
    total: torch.Tensor  # scalar, (mlm + w * ar) / (1 + w)
    mlm: torch.Tensor  # scalar, 1/gamma-weighted CE of masked prediction rows (same position)
    ar: torch.Tensor  # scalar, next-token CE of the memory stream


def collate(
    samples: list[tuple[torch.Tensor, torch.Tensor]],  # (ids [L_i] long, maskable [L_i] bool)
    *,
    block_size: int,
    mask_token_id: int,
    pad_token_id: int,
    generator: torch.Generator,
    suffix_prob: float = 0.0,
) -> Batch:
    """Pad the samples to one length L, mask them, and build their attention masks.

    Padding sits at the end of each sample, is never masked and carries no loss; no query may
    attend to a padding key (each row keeps its own diagonal, so no row is empty).
    """
    length = max(ids.numel() for ids, _ in samples)
    shared = dual_stream_attention_mask(length, block_size)  # [2L, 2L]
    rows, masks = [], []
    for ids, maskable in samples:
        pad = length - ids.numel()
        ids = torch.cat([ids, torch.full((pad,), pad_token_id, dtype=ids.dtype)])
        maskable = torch.cat([maskable, torch.zeros(pad, dtype=torch.bool)])
        sample = dual_stream_sample(ids, maskable, block_size, mask_token_id, generator, suffix_prob=suffix_prob)
        real = torch.arange(length) < length - pad  # [L]
        # Physical index -> is it a real token: the memory stream is in logical order, the
        # prediction stream's logical positions are in position_ids.
        key_real = torch.cat([real, real[sample.position_ids[length:]]])  # [2L]
        masks.append((shared & key_real[None, :]) | torch.eye(2 * length, dtype=torch.bool))
        rows.append(sample)
    stack = lambda name: torch.stack([getattr(s, name) for s in rows])  # noqa: E731
    return Batch(
        input_ids=stack("input_ids"),
        position_ids=stack("position_ids"),
        attention_mask=torch.stack(masks)[:, None],
        mlm_targets=stack("mlm_targets"),
        mlm_weights=stack("mlm_weights"),
        ar_targets=stack("ar_targets"),
    )


def wedlm_losses(model, batch: Batch, ar_weight: float = 1.0, mlm_weighting: str = "inverse_gamma",
                 normalizers: LossNormalizers | None = None) -> Losses:
    """Forward the batch and compute WeDLM's loss; the LM head runs on loss rows only.

    ``mlm_weighting``: "inverse_gamma" weights each masked row by 1/gamma of its block (normalised),
    "uniform" averages masked rows plainly. ``normalizers``: divide by these (a larger batch's)
    instead of this batch's own counts.
    """
    hidden = model.model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,
    ).last_hidden_state  # [N, 2L, hidden]
    mlm_rows = batch.mlm_targets != IGNORE  # [N, 2L]
    mlm_ce = F.cross_entropy(
        model.lm_head(hidden[mlm_rows]).float(), batch.mlm_targets[mlm_rows], reduction="none"
    )  # [num_masked]
    if mlm_weighting == "inverse_gamma":
        weights = batch.mlm_weights[mlm_rows]
    elif mlm_weighting == "uniform":
        weights = torch.ones_like(mlm_ce)
    else:
        raise ValueError(f"unknown mlm_weighting {mlm_weighting!r}")
    ar_rows = batch.ar_targets != IGNORE
    ar_logits = model.lm_head(hidden[ar_rows]).float()
    if normalizers is None:
        mlm = (mlm_ce * weights).sum() / weights.sum().clamp(min=1e-12)
        ar = F.cross_entropy(ar_logits, batch.ar_targets[ar_rows])
    else:
        mlm = (mlm_ce * weights).sum() / max(normalizers.mlm, 1e-12)
        ar = F.cross_entropy(ar_logits, batch.ar_targets[ar_rows], reduction="sum") / normalizers.ar
    if not mlm_rows.any():  # a batch where every gamma rounded to zero masks
        mlm = ar.new_zeros(())
    return Losses(total=(mlm + ar_weight * ar) / (1 + ar_weight), mlm=mlm, ar=ar)
