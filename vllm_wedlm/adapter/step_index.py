"""``StepIndex``: where a WeDLM step's logits rows are, as a binding's layout placed them, for the
stages that read or mask them (``token_logprobs.py``, ``grammar_rows.py``, the edits before the
draws). Host arrays only: both bindings (vLLM 0.26's row layouts, vLLM 0.34's model state) make one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepIndex:
    """Where a layout placed the logits rows that draw the tokens a step returns or keeps, for the
    stages that read or mask them (log-probs, grammars, the thinking budget): batch rows and
    logits rows, on the host."""

    slots: np.ndarray  # [B] int64: each request's table slot
    # The lossless windows forwarded now ([Bl] batch rows) and each one's first verification row
    # ([Bl] logits row): its row j checks (and its draw replaces) slot j + 1 of the window's
    # leading run, and the row after the run's last draws the next window's slot 0.
    lossless: np.ndarray
    first_check: np.ndarray
    # The requests that draw one token from one row ([Bd] batch rows, in batch order; [Bd] logits
    # rows): an AR-decoded one its next token, a new lossless one its window's slot 0.
    draws: np.ndarray
    draw_rows: np.ndarray
    first_token: np.ndarray  # [B] bool: the draws that are a new lossless request's first token
    row_requests: np.ndarray  # [N] int64: each logits row's batch row
    # Whether a lossless window returns its slot 0 (the token its step before drew, kept until its
    # KV is written) as its first cell: the V1 binding's windows do; the V2 binding's returned it
    # when drawn, and return the fills their rows accept and the next draw.
    returns_slot0: bool = True

    def ar_draws(self) -> tuple[np.ndarray, np.ndarray]:
        """The draws of AR-decoded requests: ([Ba] batch rows, [Ba] logits rows)."""
        ar = ~self.first_token[self.draws]
        return self.draws[ar], self.draw_rows[ar]

    def check_rows(self, batch_row: int) -> int:
        """The first verification row of the lossless window at ``batch_row``."""
        return int(self.first_check[np.searchsorted(self.lossless, batch_row)])
