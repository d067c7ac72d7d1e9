"""vLLM logits processors beyond its built-in ones (``--logits-processors``, or a plugin installed
under vLLM's ``vllm.logits_processors`` entry point), applied to the rows of a WeDLM step.

vLLM hands a processor a [num_reqs, V] logits tensor whose row i is request i of the persistent
batch (which the processor follows through ``update_state``), and the processor reads each
request's output tokens from the live list vLLM gave it when the request joined the batch. A WeDLM
step forwards several rows per request, each predicting a different position. So the rows reach
the processors in rounds: round k holds each request's k-th row (a request with fewer rows lends
an all-zero row whose result is dropped), and for the round each request's output list holds the
tokens left of that row in logical order (``RowLayout.row_contexts``): AR's context for a lossless
window's verification row and an AR-decoded request's row, so those rows stay equal to
``--decoding ar``; for a plain window's mask row the committed output, then the window's slots left
of it, a fill or the mask id where a slot is still undecided, so its output index is its own. The
lists are put back as they were after each round.

vLLM applies the processors that can move the argmax after bad words and before penalties, and the
argmax-invariant ones only when it samples, after temperature. Here both kinds run at the first
place, in that order: a greedy row's token is the same either way (the second kind cannot move the
argmax), a sampled row sees the second kind before temperature, top-k and top-p (WeDLM's sampling
order, ``core/sampling.py``, is not vLLM's anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

#: One row's context for the processors: keep the first ``keep`` tokens of the request's output
#: list and follow them with ``extra`` (window tokens in logical order).
RowContext = tuple[int, list[int]]


def custom_processors(processors) -> list:
    """The processors of the runner's ``LogitsProcessors`` that the WeDLM sampler does not cover
    itself (vLLM's built-in min_p, logit_bias and min_tokens, and the plugin's own request
    validator): first those that can move the argmax, then the rest, each in vLLM's order."""
    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS

    from vllm_wedlm.adapter.request_validator import WeDLMRequestValidator

    return [p for p in [*processors.non_argmax_invariant, *processors.argmax_invariant]
            if type(p) not in BUILTIN_LOGITS_PROCESSORS and not isinstance(p, WeDLMRequestValidator)]


def refuse_on_fixed_rows(names: Sequence[str]) -> None:
    """Fixed window rows (async scheduling) keep windows on the device only, so a step cannot give a
    processor its rows' contexts: an engine with custom processors (``names``) must schedule
    synchronously."""
    if names:
        raise ValueError(f"--decoding wedlm: custom logits processors ({', '.join(names)}) see each window row's "
                         "context only under synchronous scheduling: drop --async-scheduling (on a GPU it is off "
                         "by default with them) or fixed_window_rows")


def ranks(row_requests: np.ndarray) -> np.ndarray:
    """[N] int64: how many rows of the same request come before each row (``row_requests`` [N])."""
    order = np.argsort(row_requests, kind="stable")
    sorted_requests = row_requests[order]
    first = np.searchsorted(sorted_requests, sorted_requests, side="left")
    rank = np.empty(len(row_requests), np.int64)
    rank[order] = np.arange(len(row_requests)) - first
    return rank


def edit_in_batch_order(logits: torch.Tensor, rows: np.ndarray, requests: np.ndarray, num_reqs: int,
                        edit: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``logits`` [N, V] with ``edit`` applied to its ``rows`` [n] in place. ``edit`` takes one row
    per request of the persistent batch, as vLLM's logits processors do ([num_reqs, V]); the rows
    belong to its distinct ``requests`` [n], and the other requests lend all-zero rows whose result
    is dropped."""
    device = logits.device
    row_index = torch.from_numpy(rows).to(device, non_blocking=True)
    request_index = torch.from_numpy(requests).to(device, non_blocking=True)
    batch = logits.new_zeros(num_reqs, logits.shape[1])  # [num_reqs, V], persistent batch order
    batch[request_index] = logits[row_index]
    logits[row_index] = edit(batch)[request_index].to(logits.dtype)
    return logits


def apply_custom(processors: Sequence, logits: torch.Tensor, row_requests: np.ndarray,
                 contexts: Sequence[RowContext], output_lists: Sequence[list[int] | None]) -> torch.Tensor:
    """``logits`` [N, V] float32 with ``processors`` applied to every row, round by round (module
    docstring). ``row_requests`` [N]: each row's index into the persistent batch, whose requests'
    output lists are ``output_lists`` [num_reqs] (vLLM's ``InputBatch.req_output_token_ids``, the
    very lists the processors hold); ``contexts`` [N]: each row's context (``RowContext``)."""
    def apply_all(batch: torch.Tensor) -> torch.Tensor:
        for processor in processors:
            batch = processor.apply(batch)
        return batch

    rank = ranks(row_requests)
    for k in range(int(rank.max(initial=-1)) + 1):
        rows = np.flatnonzero(rank == k)  # at most one per request
        requests = row_requests[rows]
        restore = []  # (list, length to cut back to, its tokens from there)
        try:
            for row, request in zip(rows.tolist(), requests.tolist(), strict=True):
                tokens, (keep, extra) = output_lists[request], contexts[row]
                restore.append((tokens, keep, tokens[keep:]))
                del tokens[keep:]
                tokens.extend(extra)
            logits = edit_in_batch_order(logits, rows, requests, len(output_lists), apply_all)
        finally:
            for tokens, keep, tail in restore:
                del tokens[keep:]
                tokens.extend(tail)
    return logits
