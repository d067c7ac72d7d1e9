"""One request's window: the slots right after its committed tokens, filled or still masked.

Slot ``i`` of a window has logical position ``committed_len + i``. Filled slots are never revised;
the leading run of filled slots is what the next forward commits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Window:
    tokens: torch.Tensor  # [n] int64, the mask id where not filled
    filled: torch.Tensor  # [n] bool

    @staticmethod
    def of_masks(size: int, mask_id: int) -> Window:
        return Window(torch.full((size,), mask_id, dtype=torch.long), torch.zeros(size, dtype=torch.bool))

    def __len__(self) -> int:
        return self.tokens.numel()

    def leading_filled(self) -> int:
        """Length of the run of filled slots at the front: the tokens the next forward commits."""
        return int(self.filled.long().cumprod(0).sum())

    def extended(self, count: int, mask_id: int) -> Window:
        """The window with ``count`` masks appended at the end."""
        if count <= 0:
            return self
        tail = Window.of_masks(count, mask_id)
        return Window(torch.cat([self.tokens, tail.tokens]), torch.cat([self.filled, tail.filled]))

    def filled_end(self) -> int:
        """One past the last filled slot (0 when nothing is filled): a window shorter than this
        would lose a fill."""
        filled = torch.nonzero(self.filled, as_tuple=False)
        return int(filled.max()) + 1 if len(filled) else 0

    def truncated(self, size: int) -> Window:
        """The window's first ``size`` slots."""
        return Window(self.tokens[:size], self.filled[:size])

    def dropped(self, count: int) -> Window:
        """The window without its first ``count`` slots (committed)."""
        return Window(self.tokens[count:], self.filled[count:])

    def physical_order(self) -> torch.Tensor:
        """[n] int64: the slot fed at each physical row. Filled slots first, then masks, each group
        in logical order (a stable sort), so the leading filled run sits at its own positions."""
        return torch.argsort(self.filled.logical_not().to(torch.int8), stable=True)

    def mask_slots(self) -> torch.Tensor:
        """[m] int64: slot indices of the masks, in logical order (= physical order of mask rows)."""
        return torch.nonzero(~self.filled, as_tuple=False).flatten()

    def with_fills(self, slots: torch.Tensor, tokens: torch.Tensor) -> Window:
        new_tokens, new_filled = self.tokens.clone(), self.filled.clone()
        new_tokens[slots] = tokens
        new_filled[slots] = True
        return Window(new_tokens, new_filled)
