"""WeDLM's streaming parallel decoding in pure PyTorch (research/wedlm.md section 2).

Never imports vLLM: the reference decoder and the vLLM adapter both drive these functions, so
the algorithm is written once. They run ``batch`` (every window of a step as one tensor
computation: refill, reorder, select, fill, commit), ``selection.row_entropy`` and
``sampling.sample`` (all logits rows of a step at once). Lossless requests add a check of their
fills against the AR rows of the same forward (``sampling.verify``, ``batch.verify_windows``): a
fill is accepted when the AR row's own draw is that fill, which is speculative sampling's law.

    rows = verification_rows(plan.windows, lossless)                       # leading runs
    tokens = sample(logits_rows, sampling)                                 # AR rows first
    accepted = accept_drafts(tokens[:R], verification_drafts(plan.windows.tokens, rows))
    windows, num_commit = verify_windows(plan.windows, rows, accepted, tokens[:R], window_size, mask_id)

``step`` and ``window`` state the same step for one request, in order, readably (the tests check
that ``batch`` computes exactly this, window by window):

    plan = plan_step(window, window_size, committed_len, limit, mask_id)  # refill, reorder
    logits = forward(plan.input_ids, positions=committed_len + plan.order)
    next_window = finish_step(plan, entropy, tokens, params)              # commit, select, fill
"""

from vllm_wedlm.core.params import DEFAULT_PARAMS, WeDLMParams
from vllm_wedlm.core.step import StepPlan, finish_step, plan_step
from vllm_wedlm.core.window import Window

__all__ = ["DEFAULT_PARAMS", "StepPlan", "WeDLMParams", "Window", "finish_step", "plan_step"]
