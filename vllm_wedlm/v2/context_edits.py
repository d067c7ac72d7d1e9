"""Penalties and bad words on the V2 binding's window rows: the edits that read the tokens before a row.

A row sees what its request knows there (``core.row_context``): the prompt, the committed output,
and its window's filled slots before the position it predicts (a mask row its own slot's; a lossless
window's leading-run row, an AR row, the next one), a mask counting as no token. So a lossless
window's and a per-request AR request's rows see exactly AR's context and give AR's tokens.

The known tokens are read each step from vLLM's own ``all_token_ids`` (the prompt and every reported
token, kept through preemption by the runner) up to the window's start, then the planned window:
nothing is recorded between steps. Bad words are banned by ``core.row_context.ban_bad_words`` (the
V1 binding's rule: an unknown token matches nothing); penalties run vLLM 0.34's own penalty kernel,
the op its AR sampler runs (so the float arithmetic is AR's), given each row's output counts in
place of its request's.
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.penalties import apply_penalties

from vllm_wedlm.core.row_context import UNKNOWN, ban_bad_words, record_windows, row_tokens
from vllm_wedlm.v2.window_table import WindowStep


def apply_context_edits(logits: torch.Tensor, step: WindowStep, positions: torch.Tensor, committed: torch.Tensor,
                        req_states, penalties_state) -> torch.Tensor:
    """``logits`` [N, V] float32 (the step's canvas rows, with the other edits) with each request's
    bad words and penalties applied to its rows; ``positions`` [N]: the position each row predicts;
    ``committed`` [B]: each window's start. ``req_states``: vLLM's ``RequestState``;
    ``penalties_state``: its sampler's ``PenaltiesState`` (each request's prompt tokens)."""
    edited = np.fromiter((record.context_edits is not None for record in step.records), bool, len(step.records))
    if not edited.any():
        return logits
    device = logits.device
    window_of_row = np.repeat(np.arange(len(step.records)), step.widths)  # [N]
    rows = np.flatnonzero(edited[window_of_row])  # [n] host
    windows = np.flatnonzero(edited)  # [Be]
    local = np.cumsum(edited) - 1  # [B]: a window's row in ``history``
    prompt_len = req_states.prompt_len.np[step.host_slots[windows]].astype(np.int64)  # [Be]
    # Columns up to the furthest position a row of theirs predicts: its window's start (vLLM's count
    # of computed tokens, on the host) plus its canvas, and one more for a lossless window's last row.
    length = int((req_states.num_computed_tokens_np[step.host_slots[windows]] + step.widths[windows]).max()) + 1
    picked = torch.from_numpy(windows).to(device, non_blocking=True)
    history = _known_tokens(step, picked, committed[picked], req_states.all_token_ids.gpu, length)  # [Be, length + 1]
    index = torch.from_numpy(rows).to(device, non_blocking=True)  # [n]
    slot = torch.from_numpy(local[window_of_row[rows]]).to(device, non_blocking=True)  # [n]
    begin = torch.from_numpy(prompt_len[local[window_of_row[rows]]]).to(device, non_blocking=True)  # [n]
    position = positions[index]  # [n]
    edits = [step.records[b].context_edits for b in window_of_row[rows]]
    ban_bad_words(logits, index, history, slot, begin, position, [e.bad_words for e in edits])
    penalised = np.fromiter((e.penalises for e in edits), bool, len(edits))
    if penalised.any():
        chosen = torch.from_numpy(np.flatnonzero(penalised)).to(device, non_blocking=True)  # [m] of the n rows
        logits[index[chosen]] = _penalised(logits[index[chosen]], history, slot[chosen], begin[chosen],
                                           position[chosen], [e for e, p in zip(edits, penalised, strict=True) if p],
                                           step.slots[picked][slot[chosen]], penalties_state,
                                           length - int(prompt_len.min()))
    return logits


def _known_tokens(step: WindowStep, picked: torch.Tensor, start: torch.Tensor, all_token_ids: torch.Tensor,
                  length: int) -> torch.Tensor:
    """[Be, length + 1] int64 (``core.row_context``'s history, a row per edited window ``picked`` [Be],
    starting at ``start`` [Be]): its request's tokens before the window, then the planned window
    (filled slots' tokens, masks unknown), unknown past it; column ``length``: the bin for writes
    past the end."""
    device = all_token_ids.device
    known = all_token_ids[step.slots[picked], :length].long()  # [Be, length]
    known = torch.where(torch.arange(length, device=device)[None] < start[:, None], known, UNKNOWN)
    history = torch.cat([known, known.new_full((len(picked), 1), UNKNOWN)], 1)
    planned = step.plan.windows
    record_windows(history, torch.arange(len(picked), device=device), start, planned.tokens[picked],
                   planned.filled[picked], planned.length[picked])
    return history


def _penalised(logits: torch.Tensor, history: torch.Tensor, slot: torch.Tensor, begin: torch.Tensor,
               position: torch.Tensor, edits: list, request_slots: torch.Tensor, penalties_state,
               width: int) -> torch.Tensor:
    """``logits`` [n, V] with repetition, frequency and presence penalties, by vLLM's kernel: each
    row's output counts are those of the output tokens it sees (``row_tokens``), its prompt's its
    request's (vLLM's ``prompt_bin_mask``, ``request_slots`` [n])."""
    n, vocab = logits.shape
    device = logits.device
    output = row_tokens(history, slot, begin, position, max(1, width), vocab)  # [n, width]: vocab where none
    counts = torch.zeros(n, vocab + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, output, torch.ones_like(output, dtype=torch.int32))
    counts = counts[:, :vocab].contiguous()  # [n, V]
    # [3, n], a row each: the kernel reads one value a row (its "request" is the row itself here).
    repetition, frequency, presence = torch.tensor(
        [[e.repetition for e in edits], [e.frequency for e in edits], [e.presence for e in edits]],
        dtype=torch.float32).to(device, non_blocking=True)
    prompt_mask = penalties_state.prompt_bin_mask[request_slots].contiguous()  # [n, V / 32] packed bits
    logits = logits.contiguous()
    own_row = torch.arange(n, device=device)
    apply_penalties(logits, own_row, own_row, torch.zeros_like(own_row), repetition.contiguous(),
                    frequency.contiguous(), presence.contiguous(), prompt_mask, counts)
    return logits
