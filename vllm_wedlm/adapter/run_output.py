"""Appending a window's leading run to its request in one pass.

vLLM's scheduler appends a step's tokens one at a time, each followed by its stop check
(``Scheduler._update_request_with_output``, ``sched.utils.check_stop``), since an AR step brings
one token. A WeDLM window brings its whole leading run, about 12 tokens on arithmetic, so at batch
64 that loop ran ~800 times a step on the host. ``append_run`` finds where the same checks would
stop the run, cuts it there and appends the rest at once (one block-hash update instead of one per
token). It leaves the runs whose checks depend on each token's position in the output to vLLM's
loop: ``min_tokens`` still ahead, or repetition detection.
"""

from __future__ import annotations

from vllm.v1.request import Request, RequestStatus


def append_run(request: Request, tokens: list[int], max_model_len: int) -> tuple[list[int], bool] | None:
    """Append ``tokens`` (trimmed in place after a stop, as vLLM's loop does) to ``request``, set its
    finished status where a stop applies, and return ``(tokens, stopped)``; None where vLLM's own
    per-token loop must decide (nothing appended then).

    Per token, in vLLM's order: the EOS id, then a stop token id (FINISHED_STOPPED, the stop id
    as the reason), then ``max_model_len`` or ``max_tokens`` reached (FINISHED_LENGTH_CAPPED).
    """
    params = request.sampling_params
    if (params is None or request.pooling_params is not None or params.repetition_detection is not None
            or request.num_output_tokens + 1 < params.min_tokens):
        return None
    # Tokens the request may still take before a length stop: the stop falls on the last of them.
    room = max(min(max_model_len - request.num_tokens, request.max_tokens - request.num_output_tokens), 1)
    eos, stop_ids = params.eos_token_id, params.stop_token_ids or ()
    status = None
    for i, token in enumerate(tokens[:room]):
        if token == eos or token in stop_ids:
            status, end = RequestStatus.FINISHED_STOPPED, i + 1
            break
    else:
        if len(tokens) >= room:
            status, end = RequestStatus.FINISHED_LENGTH_CAPPED, room
    if status is not None:
        del tokens[end:]
    request.append_output_token_ids(tokens)
    if status is not None:
        request.status = status
        if status == RequestStatus.FINISHED_STOPPED and tokens[-1] != eos:
            request.stop_reason = tokens[-1]
    return tokens, status is not None
