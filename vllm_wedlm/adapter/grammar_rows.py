"""Structured outputs (a JSON schema, a regex, a choice, a grammar, a tool call) in a WeDLM step.

Three ways, by request (``config.decodes_ar``):

* **Decoded AR** (a per-request AR one, or one with a thinking budget): the
  scheduler gives it no window, and vLLM's structured-output manager computes one grammar mask for
  it per step, as for any AR request. vLLM's runner would apply the masks at its own row layout
  (one row per request plus its drafts), which a WeDLM step does not have, so the runner hands the
  masks to the layout, and ``apply_grammar`` applies each at its request's next-token row, with
  xgrammar's kernel as vLLM does.
* **In lossless windows** (a lossless request): every token it commits is an AR row's draw, so
  each verification row gets the grammar's mask after the window's leading run up to it
  (``WindowGrammars.masks_along``, as vLLM masks draft tokens), and the first token its prompt's
  last row draws gets the grammar's first mask; the fills are drawn freely and verified. Its output
  is AR's under the grammar, token for token (greedy), at several tokens per forward where the
  model's fills pass.
* **In windows** (a plain WeDLM request): its window's first undecided slot, whose context is
  exactly the request's output, is drawn under the grammar's mask and always filled, so each step
  returns at least one token, and valid; the fills right of it are drawn freely, and the run the
  step returns is cut at its first fill the grammar rejects, which becomes a mask again
  (``core.batch.reopen``). The grammar must follow the run as the step decides it, on the runner's
  side, so the runner keeps its own matcher per request (``WindowGrammars``), compiled by vLLM's
  structured-output backend from the request's own parameters, as the scheduler's is; vLLM's
  scheduler still advances its own matcher by the tokens returned, which it accepts.

On an engine with a reasoning parser the grammar starts where the reasoning ends, as vLLM's does:
the runner follows each request's reasoning with its parser (until the token that ends it, a plain
window decodes as an unconstrained one and a lossless one's rows are unmasked), and the scheduler
marks where a run ends it (``note_reasoning_end``), so that vLLM's grammar takes the rest of that
run.

This is the step's one grammar stage (``WindowGrammars.mask_rows`` before the draws,
``WindowGrammars.follow`` after them), for both row layouts: a layout says where the rows are
(``GrammarRows``, ``row_layout.StepIndex``: exact rows know each window on the host; fixed rows,
under async scheduling, point at the rows on the device) and what runs its windows return (fixed
rows bring each run of such a window back to the host first), and re-plans a window the stage cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.request import StructuredOutputRequest

if TYPE_CHECKING:
    from vllm_wedlm.adapter.step_index import StepIndex
    from vllm_wedlm.adapter.step_rows import RequestState, StepRows


@dataclass(frozen=True)
class GrammarRows:
    """Where a step's windows under a grammar draw, as a layout placed them (batch rows on the host)."""

    # The plain windows whose first undecided slot the grammar masks ([G] batch rows) and that
    # slot's logits row ([G], host or device); ``has_row`` [G] bool (device; None: all have one):
    # False for a window whose first mask has no row this step (then ``first_masks`` names one
    # of its own rows, left unmasked).
    plain: np.ndarray
    first_masks: torch.Tensor
    has_row: torch.Tensor | None
    # The lossless windows under a grammar ([Gl] batch rows) and each one's leading run, logical
    # order: its verification rows check it.
    lossless: np.ndarray
    runs: list[list[int]]
    first: np.ndarray  # [B] bool: lossless requests under a grammar that draw their first token

    @staticmethod
    def none(batch_size: int) -> GrammarRows:
        """No window under a grammar (a step whose grammars are vLLM's masks of AR rows alone)."""
        empty = np.zeros(0, np.int64)
        return GrammarRows(empty, torch.from_numpy(empty), None, empty, [], np.zeros(batch_size, bool))


def apply_grammar(logits: torch.Tensor, grammar_output, rows: dict[str, int]) -> None:
    """Mask ``logits`` [N, V] in place: the row ``rows[req_id]`` of each structured-output request of
    ``grammar_output`` (vLLM's GrammarOutput: request ids, and their masks in that order, one per
    request: it has no drafts) gets its request's mask. A request without a row this step (a
    prefill chunk) is skipped."""
    bitmask = grammar_output.grammar_bitmask  # [masks, words] int32, numpy
    chosen, indices = [], []  # which masks, and the row each goes to
    for index, req_id in enumerate(grammar_output.structured_output_request_ids):
        if req_id in rows:
            chosen.append(index)
            indices.append(rows[req_id])
    if indices:
        apply_masks(logits, torch.from_numpy(np.ascontiguousarray(bitmask[chosen])), indices)


def apply_masks(logits: torch.Tensor, masks: torch.Tensor, indices: list[int] | torch.Tensor) -> None:
    """Mask ``logits`` [N, V] in place: row ``indices[k]`` with ``masks[k]`` ([n, words] int32, on
    the host or the device: xgrammar's packed token bitmask). ``indices`` may be a device tensor
    ([n] int64, rows known on the device only: a fixed-rows step's), then no host sync on a GPU."""
    import xgrammar as xgr

    masks = masks.to(logits.device, non_blocking=True)  # [n, words]
    full = torch.full((logits.shape[0], masks.shape[1]), -1, dtype=masks.dtype, device=logits.device)
    if isinstance(indices, torch.Tensor):
        row_index = indices.to(device=logits.device, dtype=torch.long)
        if logits.is_cpu:
            indices = row_index.tolist()
    else:
        row_index = torch.tensor(indices, dtype=torch.long, device=logits.device)
    full[row_index] = masks
    if logits.is_cpu and logits.dtype != torch.float32:  # xgrammar's CPU kernel takes float32 (as vLLM does)
        as_float = logits.float()
        xgr.apply_token_bitmask_inplace(as_float, full, indices=indices)
        logits.copy_(as_float.to(logits.dtype))
    else:
        xgr.apply_token_bitmask_inplace(logits, full, indices=indices if logits.is_cpu else row_index.int())


def note_reasoning_end(manager: StructuredOutputManager, request, tokens: list[int]) -> None:
    """On the scheduler's side: where a step's ``tokens`` (a window's run, just appended to
    ``request``) end the request's reasoning, mark it ended there for vLLM's manager, so that
    ``should_advance`` advances the grammar by the tokens after the end now
    (``trim_reasoning_for_advance``), as the runner's grammar follows them (``WindowGrammars``).
    vLLM's own rule, one token per step, defers the grammar to the next step, and so would lose
    those tokens. Nothing to do without a reasoning parser, or once the reasoning has ended (in the
    prompt: ``should_fill_bitmask`` finds it)."""
    structured = request.structured_output_request
    if (structured is None or not tokens or manager.reasoner_cls is None or manager.enable_in_reasoning
            or manager.should_fill_bitmask(request)):
        return
    first = len(request.all_token_ids) - len(tokens)
    # The request's parser, built by should_fill_bitmask.
    end = reasoning_end(structured.reasoner, request.all_token_ids[:first], tokens)  # a slice: a new list
    if end is not None:
        structured.reasoning_ended = True
        structured.reasoning_end_token_index = first + end


def reasoning_end(reasoner, history: list[int], tokens: list[int]) -> int | None:
    """The index in ``tokens`` of the token that ends the reasoning, ``history`` (the token ids
    before them) coming first, as vLLM's scheduler finds it, token by token
    (``is_reasoning_end_streaming``); None if the reasoning goes on through them. ``history`` ends
    as it began."""
    size = len(history)
    try:
        for index, token in enumerate(tokens):
            history.append(token)
            if reasoner.is_reasoning_end_streaming(history, [token]):
                return index
        return None
    finally:
        del history[size:]


class WindowGrammars:
    """The runner's grammar matcher of each plain WeDLM request with structured outputs, following
    the tokens it returns: the mask of its window's first undecided slot, and how much of a run
    the grammar accepts."""

    def __init__(self, vllm_config):
        self._vllm_config = vllm_config
        self._manager: StructuredOutputManager | None = None  # vLLM's: the tokenizer, the backend
        self._grammars: dict[str, object] = {}  # req_id -> vLLM's StructuredOutputGrammar
        # req_id -> its reasoning parser and token ids so far (prompt and output), while it reasons
        # (an engine with a reasoning parser): its grammar waits for the reasoning to end.
        self._thinking: dict[str, tuple[object, list[int]]] = {}

    def add(self, req_id: str, sampling_params, prompt_token_ids: list[int]) -> None:
        """Compile the grammar of a new request, as vLLM's scheduler compiles its own (same backend)."""
        if self._manager is None:
            self._manager = StructuredOutputManager(self._vllm_config)
        structured = StructuredOutputRequest.from_sampling_params(sampling_params)
        if structured is None:
            return
        if structured.params._backend is None:  # resolved by vLLM's input processor; "auto" otherwise
            structured.params._backend = self._vllm_config.structured_outputs_config.backend
            if structured.params._backend == "auto":
                structured.params._backend = "xgrammar"
        self._manager.grammar_init(SimpleNamespace(request_id=req_id, sampling_params=sampling_params,
                                                   structured_output_request=structured))
        grammar = structured._grammar
        self._grammars[req_id] = grammar.result() if hasattr(grammar, "result") else grammar
        manager = self._manager
        if manager.reasoner_cls is not None and not manager.enable_in_reasoning:
            # The grammar starts after the reasoning, as vLLM's (``should_fill_bitmask``). A request's
            # parser kwargs (its chat-template ones) do not reach the runner: Qwen3's
            # ``enable_thinking`` changes how the parser reads text and an empty prompt only, not
            # which token ends the reasoning.
            reasoner = manager.reasoner_cls(tokenizer=manager.tokenizer)
            if not reasoner.is_reasoning_end(list(prompt_token_ids)):
                self._thinking[req_id] = (reasoner, list(prompt_token_ids))

    def kinds(self, step: StepRows, states: list[RequestState]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray]:
        """[B] bool each, for the step's requests whose grammar the runner follows: plain windows
        forwarded now, lossless ones, lossless requests drawing their first token, and of the plain
        windows those whose first undecided slot the grammar masks and always fills: not those of
        requests still reasoning, which decode as unconstrained windows until a run ends the
        reasoning (the runner still follows their runs)."""
        follows = np.fromiter((s.grammar for s in states), bool, len(states))
        plain = follows & step.window & ~step.lossless
        masked = plain
        if plain.any():  # no request walk on a step without such a window
            masked = plain & np.fromiter((req_id not in self._thinking for req_id in step.req_ids), bool,
                                         len(step.req_ids))
        return plain, follows & step.window & step.lossless, follows & step.first_token, masked

    def mask_rows(self, logits: torch.Tensor, grammar_output, req_ids: list[str], index: StepIndex,
                  rows: GrammarRows) -> None:
        """Mask ``logits`` [N, V] in place where the step's requests under a grammar draw: each
        AR-decoded one's draw row with vLLM's mask (``grammar_output``, or None); the first mask of
        each plain window with its grammar's next-token mask; each verification row of a lossless
        window with the grammar's mask along its leading run up to it; the first-token row of a
        new lossless request with its grammar's first mask."""
        device = logits.device
        if grammar_output is not None:
            ar_batch, ar_rows = index.ar_draws()
            apply_grammar(logits, grammar_output, {req_ids[b]: int(r) for b, r in zip(ar_batch, ar_rows, strict=True)})
        masks, indices = [], []  # [n, words] int32 each; [n] rows each
        if len(rows.plain):
            own = self.masks([req_ids[b] for b in rows.plain]).to(device, non_blocking=True)
            masks.append(own if rows.has_row is None else torch.where(rows.has_row[:, None], own, -1))
            indices.append(torch.as_tensor(rows.first_masks).to(device, non_blocking=True))
        for b, run in zip(rows.lossless, rows.runs, strict=True):
            masks.append(self.masks_along(req_ids[b], run))
            indices.append(torch.arange(len(run), device=device) + index.check_rows(b))
        first = np.flatnonzero(rows.first)
        if len(first):
            masks.append(self.masks([req_ids[b] for b in first]))
            draw_rows = index.draw_rows[np.searchsorted(index.draws, first)]
            indices.append(torch.from_numpy(draw_rows).to(device, non_blocking=True))
        if masks:
            apply_masks(logits, torch.cat([m.to(device) for m in masks]), torch.cat(indices))

    def follow(self, req_ids: list[str], rows: np.ndarray, runs: list[list[int]],
               verified: np.ndarray) -> list[tuple[int, int]]:
        """Advance the grammar of each window under one (``rows`` [G] batch rows) by the run it
        returns now (``runs``): a lossless one's (``verified`` [G] bool) was drawn under the
        grammar's masks, which takes it whole; a plain one's is cut at its first fill the grammar
        rejects. Returns each cut: (its index among ``rows``, the tokens kept), for the layout to
        make that fill a mask again and plan the window anew (``WindowTable.reopen``)."""
        cuts = []
        for k, (row, run) in enumerate(zip(rows, runs, strict=True)):
            if verified[k]:
                self.follow_verified(req_ids[row], run)
                continue
            kept = self.accepted(req_ids[row], run)
            if kept < len(run):
                cuts.append((k, kept))
        return cuts

    def forget(self, req_id: str) -> None:
        self._grammars.pop(req_id, None)
        self._thinking.pop(req_id, None)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._grammars

    def held(self) -> list[str]:
        """The requests whose matchers are held."""
        return list(self._grammars)

    def masks(self, req_ids: list[str]) -> torch.Tensor:
        """[n, words] int32: the mask of the next token of each request (everything while it reasons
        and once its grammar has terminated, as vLLM fills it)."""
        backend = self._manager.backend
        bitmask = backend.allocate_token_bitmask(len(req_ids))
        for index, req_id in enumerate(req_ids):
            grammar = self._grammars[req_id]
            if grammar.is_terminated() or req_id in self._thinking:
                bitmask[index].fill_(-1)
            else:
                grammar.fill_bitmask(bitmask, index)
        return bitmask

    def masks_along(self, req_id: str, run: list[int]) -> torch.Tensor:
        """[len(run), words] int32: for each token of ``run`` (a lossless window's leading run, which
        the grammar has not followed yet), the mask of the token after it, with the grammar following
        the run up to it, as vLLM masks a request's draft tokens. From a token the grammar rejects on,
        and once it has terminated, every token is allowed (as vLLM fills them): the verification
        stops before such rows, whose draws are dropped. While the request reasons every token is
        allowed; the token after the one that ends the reasoning gets the grammar's first mask, as
        AR's next step does. The grammar ends where it began."""
        bitmask = self._manager.backend.allocate_token_bitmask(len(run))  # every token allowed
        thought, ended = self._reasoning(req_id, run)
        if req_id in self._thinking and not ended:
            return bitmask
        grammar = self._grammars[req_id]
        if thought:  # the run's token ``thought - 1`` ends the reasoning
            if not grammar.is_terminated():
                grammar.fill_bitmask(bitmask, thought - 1)
            run = run[thought:]
        kept = [] if grammar.is_terminated() else grammar.validate_tokens(run)  # no advance
        advanced = 0
        for index, token in enumerate(kept):
            grammar.accept_tokens(req_id, [token])  # validated: it advances
            advanced += 1
            if grammar.is_terminated():
                break
            grammar.fill_bitmask(bitmask, thought + index)
        if advanced:
            grammar.rollback(advanced)
        return bitmask

    def follow_verified(self, req_id: str, run: list[int]) -> None:
        """Advance the grammar by a lossless window's verified ``run``, drawn under its masks, which it
        takes whole (past its end, tokens after the stop token: vLLM stops the request there)."""
        if self.accepted(req_id, run) != len(run):
            raise RuntimeError(f"lossless WeDLM request {req_id}: its grammar rejects the verified run {run}")

    def accepted(self, req_id: str, run: list[int]) -> int:
        """How many tokens of ``run`` (what a step would return) the request's grammar accepts, in
        order; it advances by them. The tokens of a request's reasoning are taken whole, and the
        grammar follows the tokens after the one that ends it. Once the grammar has terminated (at a
        stop token, where vLLM ends the request unless it ignores EOS) it takes the rest of the run
        whole, as vLLM leaves a terminated request's rows unmasked."""
        if req_id in self._thinking:
            thought, ended = self._reasoning(req_id, run)
            if not ended:
                self._thinking[req_id][1].extend(run)
                return len(run)
            del self._thinking[req_id]  # the grammar takes the tokens after the end
            return thought + self.accepted(req_id, run[thought:])
        grammar = self._grammars[req_id]
        if grammar.is_terminated():
            return len(run)
        kept = grammar.validate_tokens(run)
        if kept:
            grammar.accept_tokens(req_id, kept)
        return len(run) if grammar.is_terminated() else len(kept)

    def _reasoning(self, req_id: str, run: list[int]) -> tuple[int, bool]:
        """How many leading tokens of ``run`` are the request's reasoning, and whether its last one ends
        it (found as vLLM's scheduler finds it, token by token: ``is_reasoning_end_streaming``); (0,
        False) for a request that does not reason (any more)."""
        if req_id not in self._thinking:
            return 0, False
        end = reasoning_end(*self._thinking[req_id], run)
        return (len(run), False) if end is None else (end + 1, True)
