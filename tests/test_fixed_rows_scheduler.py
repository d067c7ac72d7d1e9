"""The scheduler of fixed window rows under async scheduling: every window gets the rows it needs.

Under async scheduling (GPU only) vLLM schedules a step while the one before it is in flight, so
the scheduler keeps each request's counts (computed tokens, output placeholders) while the runs a
window step returns arrive one step late, and holds some windows out of a schedule. Which
interleavings happen depends on when requests arrive, so an engine run covers few of them. Here
the real ``WeDLMFixedRowsScheduler`` (vLLM's async scheduler beneath it, its real KV cache manager,
prefix caching and preemption) is driven in vLLM's batch-queue order (two steps in flight) with
requests arriving at random, and every scheduled step is checked against what a window needs. The
step results come from a model of the runner that tracks counts only (``WindowCounts``): each
window's filled slots, planned as ``core.batch.plan_windows`` plans them, with fills drawn at
random; a window given fewer rows than it has (a predicted run too short) is void for the step.
The GPU runs the real engine with async scheduling in ``test_fixed_window_rows.py``.

This found the bug behind the device-side index asserts seen at batch 64 (lab notebook 5.10): a run
returned while the request's next window step was already in flight was taken off the computed
tokens once too often, so after a held step a window was scheduled rows for two runs.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest
import torch

from conftest import build_checkpoint
from vllm_wedlm.checkpoints.tiny import TinySpec

MAX_MODEL_LEN = 368
PROMPT_TOKENS = 128
BLOCK_SIZE = 16


def leading_run(filled: list[bool]) -> int:
    """The filled slots at the front of a window (``core.batch.leading_filled`` of one)."""
    return next((i for i, f in enumerate(filled) if not f), len(filled))


@dataclass
class WindowCounts:
    """What the runner knows of one request, counts only: where its KV ends and its window."""

    prompt: int
    computed: int  # tokens with KV written
    fill_rate: float  # chance that a mask is filled in a step (1: every mask, as with a huge tau)
    filled: list[bool] | None = None  # the planned window's slots, None before its first one
    resuming: bool = False  # re-prefilling after a preemption (the window is kept)
    start: int = 0  # tokens before the planned window
    w: int = 0  # W of the planned window

    def plan(self, filled: list[bool], window_size: int, keep_length: bool = False) -> int:
        """Plan the next window from ``filled`` (slot order, after the committed run): its leading
        run, then masks up to ``window_size`` slots after it, within max_model_len (as
        ``core.batch.plan_windows``); the run, which the step returns. ``keep_length``: the window
        after a preemption, its slots (and W) as they were."""
        self.start = self.computed
        if not keep_length:
            self.w = window_size
        run = leading_run(filled)
        filled_end = max((i + 1 for i, f in enumerate(filled) if f), default=0)
        length = len(filled) if keep_length else max(run + window_size, filled_end)
        length = min(length, max(MAX_MODEL_LEN - self.computed, len(filled)))
        self.filled = filled[:length] + [False] * (length - len(filled))
        return run

    def forward(self, rng: random.Random, window_size: int) -> int:
        """The planned window's forward: its leading run's KV is written, some masks filled. A window
        of W 0 (its run alone) draws the next token from its run's last row, its next run."""
        if self.w == 0:
            assert self.filled and all(self.filled), self  # a run to draw from, and no mask
            self.computed += len(self.filled)
            return self.plan([True], window_size)
        masks = [i for i, f in enumerate(self.filled) if not f]
        chosen = {i for i in masks if rng.random() < self.fill_rate} or ({rng.choice(masks)} if masks else set())
        filled = [f or i in chosen for i, f in enumerate(self.filled)]
        run = leading_run(self.filled)
        self.computed += run
        return self.plan(filled[run:], window_size)


@dataclass
class LosslessCounts(WindowCounts):
    """A lossless window (``wedlm_lossless``): its leading run is slot 0, the model's own next token,
    then unverified fills; its forward verifies them and returns the verified run, whose KV that
    forward wrote, so it returns nothing before its first window's forward."""

    def forward(self, rng: random.Random, window_size: int) -> int:
        lead = leading_run(self.filled)
        run = rng.randint(1, lead)  # slot 0 and the fills accepted after it
        filled = list(self.filled)
        if run < len(filled):
            filled[run] = True  # the row's own token after the run: the next window's slot 0
        filled[run + 1: lead] = [False] * max(lead - run - 1, 0)  # fills after a rejection: masks again
        masks = [i for i, f in enumerate(filled) if not f and i > run]
        for i in masks:
            filled[i] = rng.random() < self.fill_rate
        filled = filled[: run + window_size]
        self.computed += run
        self.plan(filled[run:], window_size)
        return run


@dataclass
class ArCounts:
    """What the runner knows of a request decoded AR on the engine (``wedlm_decoding: ar``)."""

    prompt: int
    computed: int  # tokens forwarded
    drawn: int = 0  # tokens drawn, those of steps not back yet included


@dataclass
class RunnerCounts:
    """The step results of the fixed-rows runner, from each request's ``WindowCounts``, checking
    that each window is scheduled rows that hold it (at most 2W, the server's W), or while its step
    before is in flight at least its run; an adaptive window plans with the W the scheduler chose
    for it (its step plan's ``window_sizes``), and its rows follow its own W."""

    window_size: int
    rng: random.Random
    requests: dict[str, WindowCounts | ArCounts] = field(default_factory=dict)
    layouts: dict[str, int] = field(default_factory=lambda: {"padded": 0, "exact": 0})
    resumed: int = 0  # windows kept through a preemption
    voids: int = 0  # windows void for a step (given fewer rows than they have)
    ar_pipelined: int = 0  # AR steps scheduled while the request's step before was in flight
    lossless_steps: int = 0  # lossless window steps, pipelined or not
    windows_pipelined: int = 0  # window steps scheduled while the request's window step before was in flight
    sizes_seen: set[int] = field(default_factory=set)  # the adaptive window's W, as the scheduler chose them
    narrow: int = 0  # window steps of fewer rows than the server's W
    few_logits_rows: int = 0  # plain windows stepped with fewer logits rows (the plan's mask_rows) than the server's W
    zero_windows: int = 0  # window steps of W 0 windows (the adaptive window's one AR row)
    zero_rows: int = 0  # their rows, in all
    # Report the slots after the leading run of each window a window step plans, as the runner does
    # for the adaptive window (``WeDLMRunnerOutput.window_spans``); without them the scheduler bounds them.
    spans: bool = False

    def execute(self, out, scheduler, in_flight: set[str], windows_in_flight: set[str]):
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        from vllm_wedlm.adapter.protocol import wedlm_output

        for req_id in out.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            extra_args = new.sampling_params.extra_args or {}
            if extra_args.get("wedlm_decoding") == "ar":
                self.requests[new.req_id] = ArCounts(len(new.prompt_token_ids), new.num_computed_tokens)
                continue
            kind = LosslessCounts if extra_args.get("wedlm_lossless") else WindowCounts
            self.requests[new.req_id] = kind(len(new.prompt_token_ids), new.num_computed_tokens,
                                                     self.rng.choice([1.0, 1.0, 0.5, 0.2, 0.0]))
        cached = out.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            if req_id in cached.resumed_req_ids:  # preempted: re-prefilled from here
                request = self.requests[req_id]
                if isinstance(request, ArCounts):  # vLLM resends its tokens: its draws not back are lost
                    request.computed, request.drawn = computed, scheduler.requests[req_id].num_output_tokens
                    continue
                request.computed, request.resuming = computed, True
                self.resumed += 1
        if not out.total_num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        req_ids = list(out.num_scheduled_tokens)
        self.windows_pipelined += len(set(out.scheduled_spec_decode_tokens) & windows_in_flight)
        runs = [self._step(req_id, out, scheduler, req_id in in_flight) for req_id in req_ids]
        output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=[[7] * run for run in runs])
        if not self.spans:
            return output
        return wedlm_output(output, window_spans={
            r: len(w.filled) - leading_run(w.filled) for r in out.scheduled_spec_decode_tokens
            if type(w := self.requests[r]) is WindowCounts})

    def _step(self, req_id: str, out, scheduler, in_flight: bool) -> int:
        """One request's part of a step (``in_flight``: its step before is not back); the run it returns."""
        rows = out.num_scheduled_tokens[req_id]
        drafts = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
        window = self.requests[req_id]
        from vllm_wedlm.adapter.protocol import plan_of

        plan = plan_of(out)
        chosen = plan.window_sizes if scheduler._sizer is not None else None  # (the adaptive window's)
        self.sizes_seen.update(plan.window_sizes.values())
        if isinstance(window, ArCounts):
            # Its known tokens, up to the one its last step draws (on the device if not back yet).
            assert not drafts and window.computed + rows <= window.prompt + window.drawn, (req_id, rows, window)
            self.ar_pipelined += in_flight
            window.computed += rows
            if window.computed < window.prompt + window.drawn:
                return 0  # a prefill chunk
            window.drawn += 1
            assert window.prompt + window.drawn <= MAX_MODEL_LEN, (req_id, window)
            return 1
        # W of the window this step plans (an adaptive window's own); 2W rows at most, the server's W.
        w = self.window_size if chosen is None else chosen.get(req_id, window.w)  # (a prefill chunk: unused)
        q = 2 * self.window_size
        if isinstance(window, LosslessCounts):
            return self._lossless_step(req_id, window, rows, drafts, scheduler, w)
        if window.resuming:  # its window comes back once the output tokens are prefilled again
            assert not drafts, req_id
            window.computed += rows
            if window.computed < scheduler.requests[req_id].num_tokens:
                return 0
            window.resuming = False
            run = leading_run(window.filled)
            assert window.computed == window.start + run, (req_id, window)  # the run went back as output
            return window.plan(window.filled[run:], w, keep_length=True)
        if window.filled is None:  # its prompt, perhaps with its first window after it
            window.computed += rows - drafts
            assert window.computed <= window.prompt and (not drafts or window.computed == window.prompt)
            if window.computed < window.prompt:
                return 0
            window.plan([], w)
            if not drafts:
                return 0  # an empty window's run
            assert drafts == len(window.filled), (req_id, drafts, window)
            assert plan.mask_rows >= drafts, (req_id, plan.mask_rows, window)  # a logits row per mask
        else:
            needed = len(window.filled)
            run = leading_run(window.filled)
            # With no step in flight, rows that hold the whole window (its own, or a bound on it: an
            # adaptive window's fills may reach past its W) and at most 2W; while its last step is in
            # flight (its run unknown), rows that hold at least its run (KV) and perhaps not the
            # rest (a predicted run too short): void then.
            room = MAX_MODEL_LEN - window.start
            if in_flight:
                assert run <= rows <= q, f"{req_id}: {rows} rows for a run of {run} (2W = {q})"
            else:
                assert needed <= rows <= min(q, room), f"{req_id}: {rows} rows for a window of {needed} (2W = {q})"
            self.layouts["padded" if rows == q else "exact"] += 1
            self.narrow += rows < min(self.window_size, room)  # fewer than the server's W: an adaptive window's own
            if rows < needed:
                assert rows >= run  # its run's KV is written
                self.voids += 1
                window.computed += run
                return window.plan(window.filled[run:], w)
            # The step's logits rows per window cover every slot after its run (its masks among them).
            assert plan.mask_rows >= needed - run, (req_id, plan.mask_rows, window)
            self.few_logits_rows += plan.mask_rows < min(self.window_size, room)
            if window.w == 0:
                self.zero_windows += 1
                self.zero_rows += rows
        return window.forward(self.rng, w)


    def _lossless_step(self, req_id: str, window: LosslessCounts, rows: int, drafts: int, scheduler, w: int) -> int:
        """A lossless request's part of a step: its prompt (no first window rides with it), then
        windows of 2W rows (W its own; cut at max_model_len), never void; ``w``: W of the window it plans."""
        q = 2 * window.w
        if window.resuming or window.filled is None:
            assert not drafts, req_id
            window.computed += rows
            if window.computed < scheduler.requests[req_id].num_tokens:
                return 0
            if window.resuming:  # its window is kept: it returned only tokens whose KV was written
                window.resuming = False
                assert window.computed == window.start, (req_id, window)
            else:
                window.plan([True], w)  # slot 0: the prompt's last row's draw
            return 0
        assert rows in (q, MAX_MODEL_LEN - window.start) and rows >= len(window.filled), (req_id, rows, window)
        self.lossless_steps += 1
        return window.forward(self.rng, w)


def make_scheduler(path, window_size: int | str, padding, num_blocks: int):
    """The engine's scheduler, with async scheduling on (vLLM's CPU platform turns it off);
    ``window_size`` "auto": the adaptive window."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config = EngineArgs(model=str(path), max_model_len=MAX_MODEL_LEN, max_num_seqs=64, max_num_batched_tokens=8192,
                        block_size=BLOCK_SIZE,
                        additional_config={"decoding": "wedlm", "window_size": window_size,
                                           "fixed_window_rows": True,
                                           "async_padding_tokens": padding}).create_engine_config()
    config.scheduler_config.async_scheduling = True
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    scheduler = config.scheduler_config.get_scheduler_cls()(config, kv_cache, StructuredOutputManager(config),
                                                            block_size=BLOCK_SIZE)
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return scheduler, get_request_block_hasher(BLOCK_SIZE, hash_fn)


def drive(scheduler, hasher, runner: RunnerCounts, rng: random.Random, calls: int, batch: int,
          one_call_at_a_time: bool, ar_share: float = 0.0, lossless_share: float = 0.0) -> int:
    """Send ``calls`` batches of requests (the same prompts each call, so later calls hit the
    prefix cache) arriving a few at a time, about ``ar_share`` of them decoded AR and
    ``lossless_share`` lossless, and run the
    engine's batch-queue loop until all finish; the steps scheduled. Each finished request must
    have returned its max_tokens, or up to max_model_len."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    prompts = [[rng.randrange(1000) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]
    pending = deque()
    expected, returned = {}, {}
    for call in range(calls):
        max_tokens = rng.choice([8, 17, 64, 100, 192, 240, 300])
        requests = []
        for i, prompt in enumerate(prompts):
            draw = rng.random()
            extra_args = ({"wedlm_decoding": "ar"} if draw < ar_share else
                          {"wedlm_lossless": True} if draw < ar_share + lossless_share else None)
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
            requests.append(Request(f"{call}-{i}", prompt, params, None, arrival_time=0.0, block_hasher=hasher))
            expected[requests[-1].request_id] = min(max_tokens, MAX_MODEL_LEN - len(prompt))
        pending.append(requests)
    in_flight = deque()  # (output, scheduler output), oldest last: vLLM's batch queue
    steps = 0
    while pending or scheduler.has_requests() or in_flight:
        busy = scheduler.has_requests() or in_flight
        if pending and not (one_call_at_a_time and busy and len(pending[0]) == batch):
            for _ in range(min(rng.choice([0, 1, 2, 5, batch]), len(pending[0]))):
                scheduler.add_request(pending[0].pop(0))
            if not pending[0]:
                pending.popleft()
        if scheduler.has_requests():
            out = scheduler.schedule()
            assert len(scheduler.running) <= scheduler.max_num_running_reqs
            previous = {req_id for _, step in in_flight for req_id in step.num_scheduled_tokens}
            windows = {req_id for _, step in in_flight for req_id in step.scheduled_spec_decode_tokens}
            in_flight.appendleft((runner.execute(out, scheduler, previous, windows), out))
            steps += 1
            if len(in_flight) < 2 and scheduler.has_requests():
                continue  # vLLM schedules another step before it waits for this one
        if in_flight:
            output, out = in_flight.pop()
            for outputs in scheduler.update_from_output(out, output).values():
                for request_output in outputs.outputs:
                    returned[request_output.request_id] = (returned.get(request_output.request_id, 0)
                                                           + len(request_output.new_token_ids))
        assert steps < 20000, "no progress"
    assert returned == expected
    return steps


@pytest.mark.parametrize("window_size,padding,one_call_at_a_time,num_blocks,exact,preempted,cost_shape", [
    # A tiny model's gate pads every step (2W rows, pipelined; under --async-scheduling: with no
    # flag such a model schedules synchronously, async_gate.default_async_scheduling) ...
    (16, "auto", True, 4000, False, False, None),
    (16, "auto", False, 300, False, True, None),  # calls overlap: more requests than max_num_seqs; preemption
    # ... with no padding budget, a step of 64 windows whose runs are short forwards exact rows
    # (W and a predicted run while the step before is in flight), and pads when every run is whole.
    (16, 0, True, 4000, True, False, None),
    (16, 0, False, 600, True, True, None),
    (4, 0, True, 4000, True, False, None),
    # The adaptive window: each window's rows follow its own W, which moves with what it commits.
    ("auto", "auto", False, 300, False, True, None),
    ("auto", 0, False, 600, True, True, None),
    # ... choosing on the Qwen3-8B shape's cost curve, where rows cost at batch 64: windows that
    # commit about one token fall to W 0, one AR row each.
    ("auto", "auto", False, 300, False, True, "qwen3-8b"),
])
def test_every_window_gets_its_rows(tmp_path, monkeypatch, window_size, padding, one_call_at_a_time, num_blocks,
                                    exact, preempted, cost_shape):
    path = build_checkpoint(tmp_path, TinySpec(variant="qwen3"))
    if cost_shape:
        from benchmarks.profile_steps import _choose_on_cost_curve
        from vllm_wedlm.adapter import scheduler as scheduler_module

        monkeypatch.setattr(scheduler_module, "step_cost", scheduler_module.step_cost)  # put back after the test
        _choose_on_cost_curve(cost_shape)
    scheduler, hasher = make_scheduler(path, window_size, padding, num_blocks)
    adaptive = window_size == "auto"
    for seed in range(4):
        rng = random.Random(seed)
        runner = RunnerCounts(16 if adaptive else window_size, rng, spans=adaptive and seed % 2 == 0)
        # Windows alone, then with requests decoded AR among them, then lossless ones too.
        ar_share = 0.25 if seed else 0.0
        lossless_share = 0.25 if seed == 3 else 0.0
        drive(scheduler, hasher, runner, rng, calls=3, batch=64, one_call_at_a_time=one_call_at_a_time,
              ar_share=ar_share, lossless_share=lossless_share)
        assert bool(runner.lossless_steps) == bool(lossless_share), runner.lossless_steps
        assert not scheduler.has_requests()
        # AR requests are pipelined as on an AR engine: scheduled again while their step is in flight.
        assert bool(runner.ar_pipelined) == bool(ar_share), runner.ar_pipelined
        assert runner.layouts["padded"], runner.layouts
        # Rows other than 2W: windows' own (and 2W cut at max_model_len); predicted runs only
        # where the gate does not pad, and some of them too short.
        assert runner.layouts["exact"] or not exact, runner.layouts
        assert bool(runner.voids) == exact, runner.voids
        assert bool(runner.resumed) == preempted, runner.resumed
        assert runner.windows_pipelined, runner.windows_pipelined
        # W moved (from 1 for windows that commit little up to 16 for those that fill), or never did.
        assert runner.sizes_seen >= ({1, 16} if adaptive else set()) and len(runner.sizes_seen) >= 4 * adaptive, (
            runner.sizes_seen)
        assert bool(runner.narrow) == adaptive, runner.narrow
        assert bool(runner.few_logits_rows) == adaptive, runner.few_logits_rows
        # Where rows cost, windows that commit little fall to W 0, each a run of at least one token
        # to draw from and no mask (``WindowCounts.forward``).
        if cost_shape:
            assert runner.zero_windows and 0 in runner.sizes_seen, (runner.zero_windows, runner.sizes_seen)
