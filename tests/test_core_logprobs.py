"""``core/logprobs.py`` gives the entries vLLM's own sampler gives for the same rows and tokens
(the ids, the log-probs and the ranks, ties included), so the log-probs of WeDLM's tokens read as
AR's do on any vLLM the plugin binds to."""

from __future__ import annotations

import pytest
import torch

from vllm_wedlm.core.logprobs import row_logprobs, token_entries


@pytest.mark.parametrize("k", [0, 1, 5])
def test_entries_equal_vllms_sampler(k):
    from vllm.v1.sample.sampler import Sampler

    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(9, 50, generator=generator) * 3
    logits[2] = logits[2].clamp(max=3.0)
    logits[2, :10] = 4.0  # ties at the top: ranks count them as likelier
    logits[3] = 0.0  # a flat row
    logits = logits.to(torch.bfloat16)  # vLLM's rows come in the model's dtype
    tokens = torch.tensor([0, 49, 5, 17, 3, 3, 8, 40, 22])
    ours = token_entries(row_logprobs(logits), k, tokens)
    theirs = Sampler.gather_logprobs(Sampler.compute_logprobs(logits), k, tokens)
    for mine, vllms in zip(ours, theirs[:3], strict=True):
        assert mine.dtype == vllms.dtype and torch.equal(mine, vllms)
    assert int(ours[2][2]) == 10 and int(ours[2][3]) == 50  # the tied top, and the flat row
