"""``WeDLMScheduler``: vLLM 0.34's ``DiffusionScheduler`` for WeDLM, a model not marked ``is_diffusion``.

Marking the model ``is_diffusion`` (a ``canvas_length`` in its config) would bring vLLM's diffusion
request checks (no temperature 0, no seeds, no structured outputs, ...); WeDLM is given the canvas
through ``DiffusionConfig`` alone, so two things the diffusion flag drives are set here instead:

* no bonus token: a window's step samples only what its canvas commits, so the scheduler reserves
  no slot for one (its max_model_len guard and rejection count read this attribute);
* the canvas: under synchronous scheduling the engine asks the runner for draft tokens only for a
  diffusion model, so every decoding request gets its canvas of placeholders here, each step (the
  runner fills the rows itself; their ids do not matter). Its width is the request's
  ``diffusion_canvas_length`` (vLLM's per-request key, at most the served canvas) or the served one.
"""

from __future__ import annotations

from vllm.v1.core.sched.diffusion_scheduler import DiffusionScheduler, diffusion_canvas_width
from vllm.v1.core.sched.output import SchedulerOutput


class WeDLMScheduler(DiffusionScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        for request in self.running:
            if not request.is_prefill_chunk:
                width = min(diffusion_canvas_width(request, self.num_spec_tokens), self.num_spec_tokens)
                request.spec_token_ids = [-1] * width
        return super().schedule(throttle_prefills)
