"""Per-request checks of WeDLM mode, run by vLLM's front end on every request.

vLLM calls ``validate_params`` of each configured logits processor while it validates a
request, before the request reaches the engine; a ``ValueError`` there is a 400 for the OpenAI
server and an exception for ``LLM.generate``, and nothing else is disturbed. The config hook
registers this class in WeDLM mode; its checks are ``request_checks.py``
(the V2 binding's too). It changes no logits: the WeDLM runner samples on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor.interface import LogitsProcessor

from vllm_wedlm.adapter.request_checks import check_request, serve  # noqa: F401 (serve: the config hook's)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

QUALNAME = "vllm_wedlm.adapter.request_validator:WeDLMRequestValidator"


class WeDLMRequestValidator(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        check_request(sampling_params)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

