"""The text each logits row sees, for edits that depend on it (repetition, presence and frequency
penalties): the request's tokens at every position before the one the row predicts.

AR's row at position p sees the prompt and every output token before p. A window row sees what the
request knows there: the prompt, the committed output, and the window's filled slots before its own
slot, in logical order; a mask slot before it is unknown and counts as no token. So a lossless
window's verification row (its leading run before it, every slot filled) sees exactly AR's context,
and a plain window's mask row sees the fills to its left.

A request's known tokens are kept by position, one row of ``history`` ([S, L + 1] int64, by table
slot; -1 where unknown, column L a bin for writes past the end): its prompt when it starts, each
step's forwarded tokens (prefill chunks, an AR-decoded request's tokens), then each forwarded window
from its start, filled slots as their tokens and masks as unknown. A position before a window's
start was inside an earlier window, or forwarded as an AR token, with its final token.
"""

from __future__ import annotations

import torch

UNKNOWN = -1


def empty_history(slots: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[slots, length + 1] int64 of unknown tokens (column ``length``: the bin for writes past the end)."""
    return torch.full((slots, length + 1), UNKNOWN, dtype=torch.long, device=device)


def _column(history: torch.Tensor, position: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Where a write at ``position`` goes: its own column, or the bin when not kept or past the end
    (no boolean indexing, so no host sync)."""
    end = history.shape[1] - 1
    return torch.where(keep & (position < end) & (position >= 0), position, end)


def record_tokens(history: torch.Tensor, slot: torch.Tensor, position: torch.Tensor, token: torch.Tensor,
                  keep: torch.Tensor) -> None:
    """Write forwarded tokens ([T] each: table slot, position, token id) where ``keep`` ([T] bool)."""
    history[slot, _column(history, position, keep)] = token


def record_windows(history: torch.Tensor, slot: torch.Tensor, start: torch.Tensor, tokens: torch.Tensor,
                   filled: torch.Tensor, length: torch.Tensor) -> None:
    """Write forwarded windows ([B]: table slot, start position, length; [B, C] tokens and filled in
    logical order): slot j at ``start + j`` is its token when filled, unknown when a mask."""
    index = torch.arange(tokens.shape[1], device=tokens.device)[None]  # [1, C]
    position = start[:, None] + index  # [B, C]
    value = torch.where(filled, tokens, UNKNOWN)  # [B, C]
    history[slot[:, None].expand_as(position), _column(history, position, index < length[:, None])] = value


def row_tokens(history: torch.Tensor, slot: torch.Tensor, begin: torch.Tensor, end: torch.Tensor, width: int,
               pad: int) -> torch.Tensor:
    """[N, width] int64: row i's known tokens at positions ``begin[i]`` .. ``end[i] - 1`` of its
    request (``slot`` [N]), ``pad`` at unknown positions and past the range; ``width`` must cover
    the longest range (rows past it lose tokens)."""
    position = begin[:, None] + torch.arange(width, device=history.device)[None]  # [N, width]
    inside = position < end[:, None]
    token = history[slot[:, None], position.clamp(max=history.shape[1] - 1)]  # [N, width]
    return torch.where(inside & (token != UNKNOWN), token, pad)


def ends_with(history: torch.Tensor, slot: torch.Tensor, begin: torch.Tensor, position: torch.Tensor,
              prefix: tuple[int, ...]) -> torch.Tensor:
    """[N] bool: whether row i's known tokens right before ``position[i]`` are ``prefix``, all of them
    at or after ``begin[i]`` (its output: vLLM matches a bad word's prefix against the output only).
    An empty prefix always matches; an unknown token matches nothing."""
    if not prefix:
        return torch.ones_like(position, dtype=torch.bool)
    first = position - len(prefix)  # [N]
    span = first[:, None] + torch.arange(len(prefix), device=history.device)[None]  # [N, k]
    token = history[slot[:, None], span.clamp(0, history.shape[1] - 1)]  # [N, k]
    wanted = torch.tensor(prefix, dtype=torch.long, device=history.device)[None]  # [1, k]
    return (token == wanted).all(1) & (first >= begin)


def ban_bad_words(logits: torch.Tensor, index: torch.Tensor, history: torch.Tensor, slot: torch.Tensor,
                  begin: torch.Tensor, position: torch.Tensor, row_words: list[tuple[tuple[int, ...], ...]]) -> None:
    """Ban, in place, each bad word's last token on the logits rows ``index`` ([n]) whose known
    tokens before ``position`` ([n]) are the rest of the word, all of them output (at or after
    ``begin``; ``slot``: each row's history row). ``row_words`` [n]: the bad words of each row's
    request (token ids each). The rows of one request share a word list, so rows are grouped by it."""
    groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for k, words in enumerate(row_words):
        if words:
            groups.setdefault(words, []).append(k)
    for words, members in groups.items():
        mine = torch.zeros(len(row_words), dtype=torch.bool)
        mine[members] = True
        mine = mine.to(position.device, non_blocking=True)  # [n]: the rows of this word list
        for word in words:
            banned = mine & ends_with(history, slot, begin, position, word[:-1])  # [n]
            logits[index, word[-1]] = logits[index, word[-1]].masked_fill(banned, float("-inf"))
