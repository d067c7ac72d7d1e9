"""Per-request checks of the V2 binding, run by vLLM 0.34's front end at admission.

vLLM 0.34 calls ``validate_params`` of each configured V2 logits processor before a request reaches
the engine; a ``ValueError`` there fails that request alone (a 400 for the OpenAI server), and the
engine keeps serving the others. This processor changes no logits (``add_request`` declines every
request, and the WeDLM sampler draws on its own). It checks what the V1 binding's validator checks
(``adapter/request_checks.py``: the WeDLM keys of ``extra_args``, whole-vocabulary log-probs); what
the V2 binding cannot serve at all is refused where the engine starts (``model_state.py``).
"""

from __future__ import annotations

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcessor

from vllm_wedlm.adapter.request_checks import check_request

QUALNAME = "vllm_wedlm.v2.request_validator:WeDLMRequestValidator"


class WeDLMRequestValidator(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        check_request(sampling_params)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return False  # no logits of any request are changed here

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        return logits
