"""What a WeDLM server cannot take of a request, checked by vLLM's front end before the request
reaches the engine (``validate_params`` of the plugin's logits processor: V1's
``adapter/request_validator.py``, V2's ``v2/request_validator.py``). No vLLM import, so both
bindings share it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_wedlm.config import WeDLMSettings
from vllm_wedlm.core import DEFAULT_PARAMS

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

#: The WeDLM settings of the engine whose config this process built last (``serve``), for the checks
#: that depend on them (a pinned W must be one the server runs); vLLM gives ``validate_params`` the
#: request alone. Before any: the default settings.
_server = WeDLMSettings(params=DEFAULT_PARAMS)


def serve(settings: WeDLMSettings) -> None:
    """Check requests against ``settings`` from now on (the config hook, where it builds an engine's
    config: the front end's process)."""
    global _server
    _server = settings


def check_request(sampling_params: SamplingParams) -> None:
    """``ValueError`` naming what this server cannot take of a request in WeDLM mode (both bindings)."""
    try:
        # The engine reads the knobs the same way (``protocol.classify``, over the server's
        # defaults, which are valid).
        _server.check_request(sampling_params.extra_args)
    except ValueError as error:
        raise ValueError(f"Invalid WeDLM setting in extra_args / vllm_xargs: {error}") from None
    if sampling_params.logprobs is not None and sampling_params.logprobs < 0:
        raise ValueError("Not supported with --decoding wedlm: logprobs -1 (the whole vocabulary); ask for "
                         "a number, or use a server started with --decoding ar")
