"""vLLM's structured-output grammar masks, applied at the rows of a WeDLM step.

A request with structured outputs (a JSON schema, a regex, a choice, a grammar, a tool call) is
decoded AR on a WeDLM engine (``config.decodes_ar``): the scheduler gives it no window, and vLLM's
structured-output manager computes one grammar mask for it per step, as for any AR request. vLLM's
runner would apply the masks at its own row layout (one row per request plus its drafts), which a
WeDLM step does not have, so the runner hands the masks to the layout, and this applies each at its
request's next-token row, with xgrammar's kernel as vLLM does.
"""

from __future__ import annotations

import numpy as np
import torch


def apply_grammar(logits: torch.Tensor, grammar_output, rows: dict[str, int]) -> None:
    """Mask ``logits`` [N, V] in place: the row ``rows[req_id]`` of each structured-output request of
    ``grammar_output`` (vLLM's GrammarOutput: request ids, and their masks in that order, one per
    request: it has no drafts) gets its request's mask. A request without a row this step (a
    prefill chunk) is skipped."""
    import xgrammar as xgr

    bitmask = grammar_output.grammar_bitmask  # [masks, words] int32, numpy
    chosen, indices = [], []  # which masks, and the row each goes to
    for index, req_id in enumerate(grammar_output.structured_output_request_ids):
        if req_id in rows:
            chosen.append(index)
            indices.append(rows[req_id])
    if not indices:
        return
    masks = torch.from_numpy(np.ascontiguousarray(bitmask[chosen])).to(logits.device, non_blocking=True)  # [n, words]
    full = torch.full((logits.shape[0], masks.shape[1]), -1, dtype=masks.dtype, device=logits.device)
    row_index = torch.tensor(indices, dtype=torch.long, device=logits.device)
    full[row_index] = masks
    if logits.is_cpu and logits.dtype != torch.float32:  # xgrammar's CPU kernel takes float32 (as vLLM does)
        as_float = logits.float()
        xgr.apply_token_bitmask_inplace(as_float, full, indices=indices)
        logits.copy_(as_float.to(logits.dtype))
    else:
        xgr.apply_token_bitmask_inplace(logits, full, indices=indices if logits.is_cpu else row_index.int())
