"""WeDLM's streaming parallel decoding in pure PyTorch (research/wedlm.md section 2).

Never imports vLLM: the reference decoder and the vLLM adapter both drive these functions, so
the algorithm is written once. One step of one request, in order:

    plan = plan_step(window, window_size, committed_len, limit, mask_id)  # refill, reorder
    logits = forward(plan.input_ids, positions=committed_len + plan.order)
    next_window = finish_step(plan, fills, params)                        # commit, select, fill

The heavy per-row work (entropy, sampling) is batched over all requests in
``selection.row_entropy`` and ``sampling.sample_rows``.
"""

from vllm_wedlm.core.params import DEFAULT_PARAMS, WeDLMParams
from vllm_wedlm.core.step import StepPlan, finish_step, plan_step
from vllm_wedlm.core.window import Window

__all__ = ["DEFAULT_PARAMS", "StepPlan", "WeDLMParams", "Window", "finish_step", "plan_step"]
