"""``WeDLMScheduler``: vLLM 0.34's ``DiffusionScheduler`` for WeDLM, a model not marked ``is_diffusion``.

Marking the model ``is_diffusion`` (a ``canvas_length`` in its config) would bring vLLM's diffusion
request checks (no temperature 0, no seeds, no structured outputs, ...); WeDLM is given the canvas
through ``DiffusionConfig`` alone, so two things the diffusion flag drives are set here instead:

* no bonus token: a window's step samples only what its canvas commits, so the scheduler reserves
  no slot for one (its max_model_len guard and rejection count read this attribute);
* the canvas: under synchronous scheduling the engine asks the runner for draft tokens only for a
  diffusion model, so every decoding request gets its canvas of placeholders here, each step (the
  runner fills the rows itself; their ids do not matter). Its width is the request's
  ``diffusion_canvas_length`` (vLLM's per-request key, at most the served one) or the served one.

A request whose next token is drawn from an AR row (a lossless one, whose slot 0 is the model's own
next token, and a per-request AR one, a lossless window of one row) keeps that token unforwarded:
vLLM's own invariant for AR decoding (one token more than ``num_computed_tokens``). Its canvas is
that token's row and then placeholders, every row a logits row (``pending_canvas``), so the row of
the last token draws the next one. Its prefill stops one token short (``_update_after_schedule``):
the prompt's last token is the first canvas's slot 0, whose row draws the first output token, which
V2 gives no prefill row for when a step samples no token of its own. (A prompt of one token starts
with that canvas.)

A prefill returns no token, so its prompt log-probs wait for the request's first run
(``adapter/held_prompt_logprobs.py``): vLLM 0.34 asserts a step with them returns tokens.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from vllm.v1.core.sched.diffusion_scheduler import DiffusionScheduler, diffusion_canvas_width
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from vllm_wedlm.adapter.held_prompt_logprobs import HeldPromptLogprobs
from vllm_wedlm.adapter.protocol import RequestKind, RequestRecord, classify
from vllm_wedlm.config import WeDLMSettings


def draws_from_ar_rows(record: RequestRecord) -> bool:
    """Whether the request's next token comes from an AR row: it keeps that token unforwarded."""
    return record.kind in (RequestKind.LOSSLESS, RequestKind.AR)


class WeDLMScheduler(DiffusionScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
        self.settings = WeDLMSettings(window_size=self.num_spec_tokens // 2, adaptive_window=False)
        # Each request's record (``protocol.classify``), read once; forgotten with the request.
        self._records: WeakKeyDictionary[Request, RequestRecord] = WeakKeyDictionary()
        # Prompt log-probs of a prefill (which returns no token here), until the request's first run.
        self._prompt_logprobs = HeldPromptLogprobs()

    def record(self, request: Request) -> RequestRecord:
        record = self._records.get(request)
        if record is None:
            record = self._records[request] = classify(request.sampling_params, self.settings)
        return record

    def canvas_width(self, request: Request) -> int:
        """Rows of the request's canvas: one for a per-request AR request, else its own or the
        served width."""
        if self.record(request).kind is RequestKind.AR:
            return 1
        return min(diffusion_canvas_width(request, self.num_spec_tokens), self.num_spec_tokens)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        for request in self.running:
            if draws_from_ar_rows(self.record(request)):
                if request.num_computed_tokens == request.num_tokens - 1:
                    request.spec_token_ids = [-1] * (self.canvas_width(request) - 1)
            elif not request.is_prefill_chunk:
                request.spec_token_ids = [-1] * self.canvas_width(request)
        output = super().schedule(throttle_prefills)
        for req_id, rows in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            if (draws_from_ar_rows(self.record(request))
                    and request.num_computed_tokens - rows == request.num_tokens - 1):
                # A canvas from the unforwarded token on (or a prompt of one token, scheduled new):
                # every row is a logits row, that token's first.
                output.scheduled_spec_decode_tokens[req_id] = [-1] * rows
        return output

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> None:
        # No bitmask: vLLM's runner would lay it over canvas rows as if they were drafts. The worker's
        # grammar stage masks the rows (v2/grammar_stage.py); vLLM's matcher here still follows the
        # tokens reported (update_from_output), which that stage keeps valid.
        return None

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> dict[int, EngineCoreOutputs]:
        self._prompt_logprobs.hold(model_runner_output, self.requests)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        # A prefill that would reach the last token of a request that draws from AR rows stops one
        # token short: that token is its first canvas's slot 0. Before vLLM advances the requests
        # by what is scheduled.
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in list(scheduled):
            request = self.requests[req_id]
            if (draws_from_ar_rows(self.record(request))
                    and request.num_computed_tokens < request.num_tokens - 1
                    and request.num_computed_tokens + scheduled[req_id] == request.num_tokens):
                scheduled[req_id] -= 1
                scheduler_output.total_num_scheduled_tokens -= 1
        super()._update_after_schedule(scheduler_output)
