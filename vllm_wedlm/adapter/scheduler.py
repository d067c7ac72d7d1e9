"""vLLM's scheduler, counting WeDLM windows instead of one sampled token per step.

A WeDLM window rides on vLLM's speculative-decoding data path. Its leading filled run is already
output (the runner returned it the step it was decided, like an AR token the step it is drawn,
so its KV is still to be written); the rest of the window is the request's "draft" tokens,
scheduled after it, KV written at ``num_computed_tokens + j``. Differences from speculative
decoding:

* no step samples a bonus token (``num_sampled_tokens_per_step = 0``);
* every draft is treated like a rejected one (scratch KV, overwritten next step):
  ``num_computed_tokens`` advances by the leading run only. vLLM counts a step's sampled tokens
  as accepted drafts; those that lead the next window (``WeDLMRunnerOutput.unforwarded``) are
  taken back out. A lossless window's sampled tokens are its verified run, accepted drafts indeed;
* the next window comes back with the runner's output rather than from a drafter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from vllm_wedlm.adapter.outputs import WeDLMRunnerOutput

# Under "vllm." so that vLLM's logging configuration (handler, level, format) applies.
logger = init_logger("vllm.wedlm")

#: Seconds between two "WeDLM decoding" log lines (only while requests decode).
LOG_INTERVAL_S = 5.0


@dataclass
class CommitStats:
    """Counts since the last log line. A request-forward is one request's window in one step."""

    request_forwards: int = 0
    committed_tokens: int = 0
    window_tokens: int = 0

    def line(self) -> str:
        tpf = self.committed_tokens / max(self.request_forwards, 1)
        return (f"WeDLM decoding: {tpf:.2f} tokens per forward ({self.committed_tokens} tokens committed in "
                f"{self.request_forwards} request-forwards of {self.window_tokens} window tokens)")


class WeDLMScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
        self.commit_stats = CommitStats()
        self._forwarded: dict[str, int] = {}
        self._last_log = time.monotonic()

    def update_from_output(self, scheduler_output, model_runner_output):
        self._forwarded = scheduler_output.num_scheduled_tokens  # req_id -> window slots forwarded
        if isinstance(model_runner_output, WeDLMRunnerOutput):
            # vLLM will count these as accepted drafts (KV written); their KV is written next step.
            for req_id, count in model_runner_output.unforwarded.items():
                request = self.requests.get(req_id)
                if request is not None and not request.is_finished():
                    request.num_computed_tokens -= count
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if isinstance(model_runner_output, WeDLMRunnerOutput):
            for req_id, window in model_runner_output.next_windows.items():
                request = self.requests.get(req_id)
                if request is not None and not request.is_finished() and not request.is_prefill_chunk:
                    request.spec_token_ids = window
        now = time.monotonic()
        if self.commit_stats.request_forwards and now - self._last_log >= LOG_INTERVAL_S:
            logger.info(self.commit_stats.line())
            self.commit_stats, self._last_log = CommitStats(), now
        return outputs

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        # Called once per request whose window was forwarded (a request decoded AR on this
        # engine has none), with its draft count and the tokens the step returned (before any
        # stop trims them): one request-forward.
        self.commit_stats.request_forwards += 1
        window_tokens = self._forwarded.get(request_id, num_draft_tokens)  # the leading run, then the drafts
        self.commit_stats.window_tokens += window_tokens
        self.commit_stats.committed_tokens += num_accepted_tokens
        if not self.log_stats:
            return spec_decoding_stats
        # The frontend's metrics read these as vLLM's diffusion-decoding counters (denoising
        # steps, canvas positions, committed tokens; see adapter/metrics.py). Filled directly:
        # SpecDecodingStats.observe_draft assumes at most num_speculative_tokens accepted, and
        # its per-position vector means nothing here.
        if spec_decoding_stats is None:
            spec_decoding_stats = SpecDecodingStats.new(0)
        spec_decoding_stats.num_drafts += 1
        spec_decoding_stats.num_draft_tokens += window_tokens
        spec_decoding_stats.num_accepted_tokens += num_accepted_tokens
        return spec_decoding_stats

    def shutdown(self) -> None:
        if self.commit_stats.request_forwards:
            logger.info(self.commit_stats.line())
        super().shutdown()
