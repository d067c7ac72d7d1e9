"""Per-request checks of WeDLM mode, run by vLLM's front end on every request.

vLLM calls ``validate_params`` of each configured logits processor while it validates a
request, before the request reaches the engine; a ``ValueError`` there is a 400 for the OpenAI
server and an exception for ``LLM.generate``, and nothing else is disturbed. The config hook
registers this class in WeDLM mode. It changes no logits: the WeDLM runner samples on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor.interface import LogitsProcessor

from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core import DEFAULT_PARAMS

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

QUALNAME = "vllm_wedlm.adapter.request_validator:WeDLMRequestValidator"


#: The WeDLM settings of the engine whose config this process built last (``serve``), for the checks
#: that depend on them (a pinned W must be one the server runs); vLLM gives ``validate_params`` the
#: request alone. Before any: the default settings.
_server = WeDLMSettings(params=DEFAULT_PARAMS)


def serve(settings: WeDLMSettings) -> None:
    """Check requests against ``settings`` from now on (the config hook, where it builds an engine's
    config: the front end's process)."""
    global _server
    _server = settings


class WeDLMRequestValidator(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        try:
            # The engine reads the knobs the same way (``protocol.classify``, over the server's
            # defaults, which are valid).
            _server.check_request(sampling_params.extra_args)
        except ValueError as error:
            raise ValueError(f"Invalid WeDLM setting in extra_args / vllm_xargs: {error}") from None
        if sampling_params.logprobs is not None and sampling_params.logprobs < 0:
            raise ValueError("Not supported with --decoding wedlm: logprobs -1 (the whole vocabulary); ask for "
                             "a number, or use a server started with --decoding ar")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

