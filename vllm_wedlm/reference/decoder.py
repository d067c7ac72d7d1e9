"""WeDLM decoding without a KV cache: every step recomputes the whole sequence.

Slow and simple on purpose. Each step feeds ``prompt + committed + window`` (window in physical
order) with logical RoPE positions and plain causal attention, which is exactly what the paged-KV
engine computes, and runs the same ``core`` functions as the engine (``core.batch`` and
``core.sampling``, here on a batch of one window), lossless mode included. Users can run it on any WeDLM
checkpoint to check what the engine produces:

    from vllm_wedlm.models.transformers_body import load_transformers_model
    decoder = ReferenceDecoder(load_transformers_model(path), mask_token_id=config.mask_token_id)
    out = decoder.generate(prompt_ids, StopRule(max_tokens=64, stop_token_ids={eos}))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from vllm_wedlm.core.batch import (
    WindowBatch,
    finish_windows,
    leading_filled,
    plan_windows,
    verification_drafts,
    verification_rows,
    verify_windows,
)
from vllm_wedlm.core.params import (
    DEFAULT_PARAMS,
    DEFAULT_WINDOW_SIZE,
    WeDLMParams,
    selection_tensors,
    validate_window_size,
)
from vllm_wedlm.core.sampling import SamplingBatch, SamplingSpec, accept_drafts, sample
from vllm_wedlm.core.selection import row_entropy


@dataclass(frozen=True)
class StopRule:
    """When a request ends, as vLLM decides it: after a stop token (which is kept), after
    max_tokens, or at max_model_len.

    Only the last shapes the window: its slots end before max_model_len (the KV room of a vLLM
    request), while max_tokens merely truncates the committed tokens, as in WeDLM's engine, so a
    request's first n tokens are the same whatever its max_tokens >= n.
    """

    max_tokens: int
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    max_model_len: int | None = None


@dataclass
class ReferenceOutput:
    token_ids: list[int]
    num_forwards: int  # decode forwards (the prompt is not prefilled separately)
    finish_reason: str  # "stop" or "length"
    # Tokens each decode forward committed, in order (len == num_forwards, sum == len(token_ids)):
    # how far into its window each step's leading run reached.
    runs: list[int] = field(default_factory=list)
    # Plain WeDLM: the log-prob of each output token in the mask row that filled its slot (its raw
    # logits' log-softmax, as vLLM reports a token's log-prob), in output order; empty when lossless.
    logprobs: list[float] = field(default_factory=list)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / max(self.num_forwards, 1)


class ReferenceDecoder:
    def __init__(self, model, mask_token_id: int, window_size: int = DEFAULT_WINDOW_SIZE):
        self.model = model
        self.mask_token_id = mask_token_id
        self.window_size = validate_window_size(window_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], stop: StopRule, params: WeDLMParams = DEFAULT_PARAMS,
                 sampling: SamplingSpec | None = None, window_sizes: Sequence[int] = ()) -> ReferenceOutput:
        """Decode ``prompt_ids`` until ``stop``.

        ``window_sizes``: W of each window planned, in order (the first forward's, the second's,
        ...), where the engine sized each window itself (the adaptive window, its default; the engine's
        record: ``wedlm_trace_window_sizes``); past its end, ``window_size``. W 0 is an AR step
        (``_ar_draw``): the forward commits the window's leading run and draws one token from the
        last committed row, so that a sequence of zeros is AR decoding.
        """
        sampling = SamplingSpec() if sampling is None else sampling  # greedy by default
        prompt_len = len(prompt_ids)
        if stop.max_model_len is not None and prompt_len >= stop.max_model_len:
            raise ValueError(f"a prompt of {prompt_len} tokens leaves no room below max_model_len {stop.max_model_len}")
        sizes = [w if w == 0 and type(w) is int else validate_window_size(w) for w in window_sizes]

        def size(k: int) -> int:  # W of the k-th window planned
            return sizes[k] if k < len(sizes) else self.window_size

        sequence = list(prompt_ids)  # prompt + committed
        windows = WindowBatch.empty(1, 2 * max([self.window_size, *sizes]), self.mask_token_id)
        if params.lossless:
            # The window starts with the model's own next token, drawn from the prompt's last row
            # (the engine's prefill forward, not counted below).
            windows.tokens[0, 0], windows.filled[0, 0] = self._ar_draw(sequence, sampling)[0], True
        tau, lam = selection_tensors([params])
        limit = None if stop.max_model_len is None else torch.tensor([stop.max_model_len])
        num_forwards, runs = 0, []
        filled_logprob: dict[int, float] = {}  # plain: absolute position -> its filling row's log-prob
        logprobs: list[float] = []
        while True:
            if size(num_forwards) == 0:  # an AR step: it commits the window's run, then draws one token
                lead = int(leading_filled(windows.filled)[0])
                # A plain window's leading run; a lossless one's slot 0 (its fills are unverified).
                run = windows.tokens[0, : min(lead, 1) if params.lossless else lead].tolist()
                kept, reason = _stop_point(len(sequence) - prompt_len, len(sequence), run, stop)
                if not params.lossless:  # returned before the forward, as a window's run
                    if num_forwards:
                        runs.append(kept)
                    logprobs += [filled_logprob.pop(len(sequence) + i) for i in range(kept)]
                    if reason is not None:
                        return ReferenceOutput(sequence[prompt_len:] + run[:kept], num_forwards, reason, runs, logprobs)
                draw, logprob = self._ar_draw(sequence + run, sampling)
                num_forwards += 1
                if params.lossless:  # returned with its forward, as a verified run
                    runs.append(kept)
                    if reason is not None:
                        return ReferenceOutput(sequence[prompt_len:] + run[:kept], num_forwards, reason, runs)
                sequence.extend(run)
                filled_logprob = {len(sequence): logprob}  # the window's other fills are dropped
                windows = WindowBatch.empty(1, windows.capacity, self.mask_token_id)
                windows.tokens[0, 0], windows.filled[0, 0] = draw, True  # the next window's slot 0
                continue
            plan = plan_windows(windows, size(num_forwards), torch.tensor([len(sequence)]), limit)
            n, num_masks = int(plan.windows.length[0]), int(plan.num_masks[0])
            num_rows = verification_rows(plan.windows, torch.tensor([params.lossless]))  # [1]
            checks = int(num_rows[0])
            if not params.lossless:
                # A plain window's leading filled run is decided before its forward (every slot
                # before it is filled, and fills are never revised): the engine returns it then,
                # so a stop inside it ends the request without this forward.
                run = plan.windows.tokens[0, : int(plan.num_commit[0])].tolist()
                kept, reason = _stop_point(len(sequence) - prompt_len, len(sequence), run, stop)
                if num_forwards:  # the run the last forward's fills completed (none before the first)
                    runs.append(kept)
                logprobs += [filled_logprob.pop(len(sequence) + i) for i in range(kept)]
                if reason is not None:
                    return ReferenceOutput(sequence[prompt_len:] + run[:kept], num_forwards, reason, runs, logprobs)
            logits = self._forward(sequence, plan.input_ids[0, :n], len(sequence) + plan.order[0, :n])
            num_forwards += 1
            # The step's logits rows, as the engine takes them: verification rows, then mask rows.
            rows = torch.cat([logits[:checks], logits[n - num_masks:]])  # [checks + num_masks, V]
            batch = self._sampling([sampling], [checks + num_masks], ar_rows=checks)
            tokens = sample(rows, batch, self.mask_token_id).cpu()
            if not params.lossless:  # each mask row's draw, at its slot's position (kept once filled)
                mask_logprobs = torch.log_softmax(rows[checks:].float(), -1).cpu()  # [num_masks, V]
                for k, slot in enumerate(plan.order[0, n - num_masks: n].tolist()):
                    filled_logprob[len(sequence) + slot] = float(mask_logprobs[k, tokens[checks + k]])
            verified, num_commit = plan.windows, plan.num_commit
            if checks:
                drafts = verification_drafts(plan.windows.tokens, num_rows)
                # The check rows' own draws decide (core.sampling.verify): no second draw.
                accepted = accept_drafts(tokens[:checks], drafts)
                # A rejection cuts the window to the next plan's W (the engine's order).
                # (A next window of W 0 still keeps the token after the run: its AR step commits it.)
                verified, num_commit = verify_windows(plan.windows, num_rows, accepted, tokens[:checks],
                                                      max(size(num_forwards), 1), self.mask_token_id)
            if params.lossless:  # its run is known once verified, and returned then
                run = plan.windows.tokens[0, : int(num_commit[0])].tolist()
                kept, reason = _stop_point(len(sequence) - prompt_len, len(sequence), run, stop)
                runs.append(kept)
                if reason is not None:
                    return ReferenceOutput(sequence[prompt_len:] + run[:kept], num_forwards, reason, runs)
            sequence.extend(run)
            mask_logits = rows[checks:]  # [num_masks, V], own rows, no shift
            windows = finish_windows(plan.windows, num_commit, row_entropy(mask_logits).cpu(), tokens[checks:],
                                     tau, lam, self.mask_token_id, verified)

    def _ar_draw(self, context: list[int], sampling: SamplingSpec) -> tuple[int, float]:
        """The token drawn from the last row of ``context`` and its log-prob: an AR step's forward
        (vLLM's), which writes the KV of the run it commits and draws from its last row (with no run,
        the last committed token's row, forwarded again)."""
        logits = self._forward(context[:-1], torch.tensor(context[-1:]), torch.tensor([len(context) - 1]))  # [1, V]
        draw = int(sample(logits, self._sampling([sampling], [1], ar_rows=1), self.mask_token_id)[0])
        return draw, float(torch.log_softmax(logits[0].float(), -1)[draw])

    def _sampling(self, specs: list[SamplingSpec], rows: list[int], ar_rows: int) -> SamplingBatch:
        """The rows' sampling settings, the first ``ar_rows`` being next-token rows (the mask token
        is not banned there, as in ``--decoding ar``)."""
        batch = SamplingBatch.of(specs, rows, self.device)
        mask_rows = torch.arange(sum(rows), device=self.device) >= ar_rows
        return replace(batch, ban_mask_token=batch.ban_mask_token & mask_rows)

    def _forward(self, sequence: list[int], window_ids: torch.Tensor, window_positions: torch.Tensor):
        """Logits [n, V] of the window rows after the full causal forward of sequence + window."""
        ids = torch.cat([torch.tensor(sequence, dtype=torch.long), window_ids])
        positions = torch.cat([torch.arange(len(sequence), dtype=torch.long), window_positions])
        out = self.model(input_ids=ids[None].to(self.device), position_ids=positions[None].to(self.device))
        return out.logits[0, len(sequence):]


def _stop_point(num_output: int, num_tokens: int, run: list[int], stop: StopRule) -> tuple[int, str | None]:
    """Where ``stop`` ends a request of ``num_output`` output and ``num_tokens`` tokens in all that
    gets ``run`` next, token by token as vLLM's check_stop does: (tokens of ``run`` kept, "stop"
    or "length"), or (len(run), None) when it goes on."""
    for i, token in enumerate(run):
        if token in stop.stop_token_ids:
            return i + 1, "stop"
        if num_output + i + 1 >= stop.max_tokens or num_tokens + i + 1 == stop.max_model_len:
            return i + 1, "length"
    return len(run), None
