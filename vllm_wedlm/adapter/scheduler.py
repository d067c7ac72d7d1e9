"""vLLM's scheduler, counting WeDLM windows instead of one sampled token per step.

A WeDLM window rides on vLLM's speculative-decoding data path: the window's tokens are the
request's "draft" tokens, scheduled after its committed tokens, KV written at
``num_computed_tokens + j``. Two differences from speculative decoding:

* no step samples a bonus token (``num_sampled_tokens_per_step = 0``): the tokens a step returns
  are exactly the committed ones, so ``num_computed_tokens`` advances by that count and every
  other window slot is treated like a rejected draft (scratch, overwritten next step);
* the next window comes back with the runner's output rather than from a drafter.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler

from vllm_wedlm.adapter.outputs import WeDLMRunnerOutput


class WeDLMScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if isinstance(model_runner_output, WeDLMRunnerOutput):
            for req_id, window in model_runner_output.next_windows.items():
                request = self.requests.get(req_id)
                if request is not None and not request.is_finished() and not request.is_prefill_chunk:
                    request.spec_token_ids = window
        return outputs

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        # vLLM's draft-acceptance statistics assume at most num_speculative_tokens accepted
        # per step; WeDLM commits report through their own metrics instead.
        return spec_decoding_stats
