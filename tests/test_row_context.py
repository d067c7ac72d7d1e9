"""What each logits row sees for penalties (core/row_context.py): the prompt, the committed output,
and the window's filled slots before its own, masks unknown; forwarded tokens by position."""

from __future__ import annotations

import pytest
import torch

from vllm_wedlm.core.row_context import UNKNOWN, empty_history, record_tokens, record_windows, row_tokens

pytestmark = pytest.mark.fast

PAD = 99


def test_rows_see_the_known_tokens_before_their_position():
    history = empty_history(slots=2, length=12)
    # Slot 1: prompt [5, 6] at 0-1, committed output [7] at 2, then a window from 3: [8, mask, 9, mask].
    record_tokens(history, torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2]), torch.tensor([5, 6, 7]),
                  torch.tensor([True, True, True]))
    record_windows(history, torch.tensor([1]), torch.tensor([3]), torch.tensor([[8, 0, 9, 0, 4, 4]]),
                   torch.tensor([[True, False, True, False, False, False]]), torch.tensor([4]))
    assert history[1, :8].tolist() == [5, 6, 7, 8, UNKNOWN, 9, UNKNOWN, UNKNOWN]  # past the window: untouched
    assert (history[0] == UNKNOWN).all()
    slot = torch.tensor([1, 1, 1, 1])
    prompt_len = torch.tensor([2, 2, 2, 2])
    # Rows predicting positions 3 (the first slot), 4 (the mask after it), 6 (the last mask), 2.
    position = torch.tensor([3, 4, 6, 2])
    output = row_tokens(history, slot, prompt_len, position, width=5, pad=PAD)
    assert output.tolist() == [[7, PAD, PAD, PAD, PAD], [7, 8, PAD, PAD, PAD], [7, 8, PAD, 9, PAD],
                               [PAD] * 5]
    prompt = row_tokens(history, slot, torch.zeros_like(prompt_len), prompt_len, width=3, pad=PAD)
    assert prompt.tolist() == [[5, 6, PAD]] * 4


def test_writes_not_kept_or_past_the_end_change_nothing():
    history = empty_history(slots=1, length=4)
    record_tokens(history, torch.tensor([0, 0, 0]), torch.tensor([1, 4, 7]), torch.tensor([3, 3, 3]),
                  torch.tensor([False, True, True]))
    assert (history[0, :4] == UNKNOWN).all()
    # A window running past the end writes what fits; slots past its length write nothing.
    record_windows(history, torch.tensor([0]), torch.tensor([2]), torch.tensor([[1, 2, 3]]),
                   torch.tensor([[True, True, True]]), torch.tensor([3]))
    assert history[0, :4].tolist() == [UNKNOWN, UNKNOWN, 1, 2]
    record_windows(history, torch.tensor([0]), torch.tensor([0]), torch.tensor([[6, 6, 6]]),
                   torch.tensor([[True, True, True]]), torch.tensor([1]))
    assert history[0, :4].tolist() == [6, UNKNOWN, 1, 2]
