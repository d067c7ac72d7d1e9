"""What the WeDLM runner hands back to the scheduler each step."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput


@dataclass
class WeDLMRunnerOutput(ModelRunnerOutput):
    """vLLM's runner output plus each request's next window.

    ``sampled_token_ids`` holds the tokens this step decided (possibly none). The next window
    travels with the output (it is pickled to the scheduler like the rest), and the scheduler
    schedules it as the request's next draft tokens.
    """

    # req_id -> next step's draft tokens in physical order (filled slots first, then masks)
    next_windows: dict[str, list[int]] = field(default_factory=dict)
    # req_id -> how many of this step's sampled tokens lead the request's next window: decided
    # (every slot before them filled) but not forwarded yet. vLLM counts every sampled token of a
    # request with drafts as an accepted draft, whose KV this step wrote; these have none yet.
    unforwarded: dict[str, int] = field(default_factory=dict)
    # Fixed window rows, adaptive window: req_id -> how many slots follow the leading run of the
    # window this step planned for it (its length, less that run), as the device's table holds it.
    # The scheduler otherwise knows only a bound (every fill a wider window left, kept until committed).
    window_spans: dict[str, int] = field(default_factory=dict)


def wedlm_output(output: ModelRunnerOutput, **wedlm_fields) -> WeDLMRunnerOutput:
    """vLLM's ``output`` as a ``WeDLMRunnerOutput`` with ``wedlm_fields`` (the others empty)."""
    return WeDLMRunnerOutput(**{f.name: getattr(output, f.name) for f in fields(output)}, **wedlm_fields)


def with_window_spans(output: ModelRunnerOutput, req_ids: list[str], spans: torch.Tensor) -> WeDLMRunnerOutput:
    """``output`` with the spans of the windows of ``req_ids`` (``spans`` [Bw] int32, on the host or
    waited for): ``WeDLMRunnerOutput.window_spans``."""
    return wedlm_output(output, window_spans=dict(zip(req_ids, spans.tolist(), strict=True)))


class AsyncOutputWithSpans(AsyncModelRunnerOutput):
    """vLLM's async output of a fixed-rows step, with the spans of the windows it planned
    (``WeDLMRunnerOutput.window_spans``) copied to the host behind the step, as vLLM copies its
    sampled tokens: nothing waits for them until vLLM asks for the output."""

    def __init__(self, output: AsyncModelRunnerOutput, req_ids: list[str], spans: torch.Tensor):
        self._output, self._req_ids = output, req_ids
        self._spans = spans.to("cpu", non_blocking=True)  # [Bw] int32 (pinned when from a GPU)
        self._copied = None
        if spans.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def get_output(self) -> ModelRunnerOutput:
        output = self._output.get_output()
        if self._copied is not None:
            self._copied.synchronize()
        return with_window_spans(output, self._req_ids, self._spans)
