"""The runner's side of what it hands back each step: the windows' spans of a fixed-rows step, with
vLLM's output (``protocol.WeDLMRunnerOutput``), copied to the host behind the step."""

from __future__ import annotations

import torch
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

from vllm_wedlm.adapter.protocol import WeDLMRunnerOutput, wedlm_output


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
