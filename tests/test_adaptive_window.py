"""The adaptive window (``--wedlm-window-size auto``) through ``vllm.LLM``.

Each step the scheduler gives every window it plans its own W (``core/window_policy.py``: from
what the request's windows committed and what rows cost), so a request's W moves as its text gets
easier or harder. The engine records the W of each window it plans (``wedlm_trace_window_sizes``);
the reference decoder, given that sequence, must produce exactly the engine's tokens and forwards,
plain and lossless requests mixed in one batch, in both row layouts, and through preemption and
chunked re-prefill. The first batch is built so that requests start and finish at different steps
(the first request's prompt is short and every other one is longer than a step's token budget).
"""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

MAX_WINDOW, TAU = 16, 0.4
MAX_NUM_SEQS = 8
TOKEN_BUDGET = MAX_NUM_SEQS * 2 * MAX_WINDOW  # max_num_batched_tokens: every window fits
PROMPTS = ["0, 1, 2, the lamp reads 0 apples"] + [
    ", ".join(f"{k} apples" for k in range(i, i + 100)) + f", the lamp reads {i * 7}" for i in range(1, 14)]
MAX_TOKENS = [120] + [24 + 9 * (i % 5) for i in range(1, len(PROMPTS))]  # they finish at different steps
LOSSLESS = [i % 3 == 0 for i in range(len(PROMPTS))]
#: W 0: an AR step of the whole batch where windows commit too little for their cost. Where a test
#: wants it, the AR step's cost is fixed (``ar_step_cost``), so that the choice depends only on what
#: the windows commit, not on timings.
AR_STEP_COST = 0.5


def llm_async(fixed_rows: bool) -> bool:
    """Whether the engine runs async scheduling: asked with fixed rows, granted on a GPU (vLLM's CPU
    platform turns it off)."""
    import torch

    return fixed_rows and torch.cuda.is_available()


def generate_traced(llm, prompts, params) -> tuple[list, dict[str, list[int]], int]:
    """``llm.generate`` with the engine's record of W on: the outputs, each request's W sequence (by its
    request id) and the windows forwarded meanwhile (``wedlm_request_forwards``)."""
    llm.collective_rpc("wedlm_trace_window_sizes", args=(True,))
    forwards_before = sum(llm.collective_rpc("wedlm_request_forwards"))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    forwards = sum(llm.collective_rpc("wedlm_request_forwards")) - forwards_before
    (trace,) = llm.collective_rpc("wedlm_trace_window_sizes", args=(False,))
    return outputs, {internal_id.rsplit("-", 1)[0]: sizes for internal_id, sizes in trace.items()}, forwards


def record_diffusion_counts(llm) -> dict[str, int]:
    """The totals of the diffusion counters the engine's scheduler hands vLLM's stat loggers
    (``SchedulerStats.spec_decoding_stats``; ``vllm serve`` publishes them as
    ``vllm:diffusion_num_*``), from now on: the scheduler of the in-process engine core
    (``running_llm`` on the CPU) has its ``make_stats`` observed."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    make_stats, totals = scheduler.make_stats, {"denoising steps": 0, "committed tokens": 0}

    def observed(*args, **kwargs):
        stats = make_stats(*args, **kwargs)
        if stats is not None and stats.spec_decoding_stats is not None:
            totals["denoising steps"] += stats.spec_decoding_stats.num_drafts
            totals["committed tokens"] += stats.spec_decoding_stats.num_accepted_tokens
        return stats

    scheduler.make_stats = observed
    return totals


def assert_replayed(reference, outputs, by_request, rules, lossless) -> list:
    """Assert that each output is the reference decoder's at the W sequence the engine recorded for it
    (``rules``, ``lossless``: each request's StopRule and mode); the reference's outputs."""
    expected = []
    for output, rule, f in zip(outputs, rules, lossless, strict=True):
        sizes = by_request[output.request_id]
        replayed = reference.generate(list(output.prompt_token_ids), rule, WeDLMParams(TAU, 0.02, lossless=f),
                                      window_sizes=sizes)
        assert list(output.outputs[0].token_ids) == replayed.token_ids, (output.request_id, f, sizes)
        expected.append(replayed)
    return expected


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("adaptive"), TinySpec(variant="qwen2", logit_scale=100.0))


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["exact-rows", "fixed-rows"])
def test_adaptive_window_equals_the_reference_at_the_same_w(checkpoint, fixed_rows):
    """``fixed_rows``: --async-scheduling, fixed window rows (synchronous on a CPU); else
    --no-async-scheduling, exact rows."""
    from vllm import SamplingParams

    config = WeDLMConfig.from_pretrained(checkpoint)
    reference = ReferenceDecoder(load_transformers_model(checkpoint), config.mask_token_id, MAX_WINDOW)
    wedlm = {"decoding": "wedlm", "window_size": "auto", "entropy_threshold": TAU, "fixed_window_rows": fixed_rows}
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, extra_args={"wedlm_lossless": lossless})
              for n, lossless in zip(MAX_TOKENS, LOSSLESS, strict=True)]
    with running_llm(checkpoint, dtype="float32", async_scheduling=fixed_rows,
                     additional_config=wedlm, max_num_seqs=MAX_NUM_SEQS,
                     max_num_batched_tokens=TOKEN_BUDGET) as llm:
        outputs, by_request, forwards = generate_traced(llm, PROMPTS, params)

    # The premise of the W movements asserted below: only the first prompt fits one step's budget.
    assert [len(o.prompt_token_ids) > TOKEN_BUDGET for o in outputs] == [False] + [True] * (len(PROMPTS) - 1)
    # Async scheduling (fixed rows on a GPU) may schedule one window step more per request, before the
    # step that ends it is back; its tokens are dropped (and its plan is past the reference's end).
    extra = 1 if llm_async(fixed_rows) else 0
    replayed = assert_replayed(reference, outputs, by_request, [StopRule(max_tokens=n) for n in MAX_TOKENS], LOSSLESS)
    for output, expected in zip(outputs, replayed, strict=True):
        sizes = by_request[output.request_id]
        # A window is planned after the prompt and after every forward, the last one included, unless
        # that forward was an AR step (W 0: in place of the window planned for it).
        assert 0 <= len(sizes) - (expected.num_forwards + (sizes[-1] != 0)) <= extra, (output.request_id, sizes)
    expected_forwards = sum(expected.num_forwards for expected in replayed)
    assert 0 <= forwards - expected_forwards <= extra * len(PROMPTS)

    # W really moved: the whole window for each request's first plans, then down where its windows
    # committed little (a window kept its fills), and up again.
    first = by_request[outputs[0].request_id]
    assert first[0] == MAX_WINDOW and min(first) < MAX_WINDOW, first
    assert any(a < b for sizes in by_request.values() for a, b in zip(sizes[:-1], sizes[1:], strict=True)), by_request
    assert len({w for sizes in by_request.values() for w in sizes}) >= 3, by_request
    # And the adaptive window is not the fixed one: at W 16 throughout, requests decode differently.
    fixed = [reference.generate(list(o.prompt_token_ids), StopRule(max_tokens=n), WeDLMParams(TAU, 0.02, lossless=f))
             for o, n, f in zip(outputs, MAX_TOKENS, LOSSLESS, strict=True)]
    assert sum(e.num_forwards for e in fixed) != expected_forwards


#: Preemption: a KV cache of 40 blocks of 16 holds one long request or a few short ones, not the
#: batch; re-prefills longer than CHUNK tokens run in chunks (as in test_window_invariance.py).
BLOCK, KV_BLOCKS, CHUNK, MAX_MODEL_LEN, PREEMPT_TOKENS = 16, 40, 64, 512, 96
PREEMPT_PROMPTS = ([f"{i}, {i + 1}, the lamp reads {i} apples" for i in range(28)]
                   + [", ".join(str(n) for n in range(i * 7, i * 7 + 140)) for i in range(4)])


@pytest.mark.parametrize(("fixed_rows", "ar_steps"), [(False, False), (True, False), (False, True)],
                         ids=["exact-rows", "fixed-rows", "exact-rows-ar-steps"])
def test_adaptive_windows_survive_preemption(checkpoint, fixed_rows, ar_steps):
    """Preempted requests keep their window (and its W) through the re-prefill: every output is the
    reference decoder's at the engine's W sequence, lossless ones included. ``ar_steps``: the batch
    steps AR (W 0) where its windows commit little, and requests are preempted at any W (one that
    held no window re-prefills into its next draw, or its next window)."""
    from vllm import SamplingParams

    from engines import kv_bytes_per_token

    config = WeDLMConfig.from_pretrained(checkpoint)
    reference = ReferenceDecoder(load_transformers_model(checkpoint), config.mask_token_id, MAX_WINDOW)
    wedlm = {"decoding": "wedlm", "window_size": "auto", "entropy_threshold": TAU,
             "ar_step_cost": AR_STEP_COST if ar_steps else "off"}
    if fixed_rows:  # every step pipelined, 2W rows per window (what async scheduling runs at small costs)
        wedlm.update(fixed_window_rows=True, async_padding_tokens=1 << 20)
    lossless = [i % 3 == 1 for i in range(len(PREEMPT_PROMPTS))]
    params = [SamplingParams(temperature=0.0, max_tokens=PREEMPT_TOKENS, ignore_eos=True,
                             extra_args={"wedlm_lossless": f}) for f in lossless]
    with running_llm(checkpoint, dtype="float32", additional_config=wedlm, async_scheduling=fixed_rows or None,
                     max_model_len=MAX_MODEL_LEN, block_size=BLOCK,
                     kv_cache_memory_bytes=KV_BLOCKS * BLOCK * kv_bytes_per_token(config),
                     max_num_batched_tokens=32 * MAX_WINDOW, long_prefill_token_threshold=CHUNK,
                     enable_chunked_prefill=True, disable_log_stats=False) as llm:
        (before,) = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
        outputs, by_request, _ = generate_traced(llm, PREEMPT_PROMPTS, params)
        (after,) = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
        layouts = llm.collective_rpc("wedlm_row_layouts")[0] if fixed_rows else {}
    assert after - before >= 10, f"only {after - before} preemptions: the batch was meant not to fit"
    rule = StopRule(max_tokens=PREEMPT_TOKENS, max_model_len=MAX_MODEL_LEN)
    assert_replayed(reference, outputs, by_request, [rule] * len(outputs), lossless)
    assert len({w for sizes in by_request.values() for w in sizes}) >= 3, by_request
    # W 0 happened where it may, and only there.
    assert any(0 in sizes for sizes in by_request.values()) == ar_steps, by_request
    if fixed_rows:  # every step padded, at whatever W (below the server's 2W rows), and no window void
        assert layouts.get("padded") and not layouts.get("exact") and not layouts["void_windows"], layouts


@pytest.mark.parametrize("logit_scale", [1.0, 100.0], ids=["uncertain", "confident"])
def test_windows_fall_to_ar_steps_and_come_back(tmp_path_factory, monkeypatch, logit_scale):
    """Windows on the synchronous engine take AR steps (W 0: vLLM's own step, every request one
    token) where they commit little, and come back (a probe every few AR steps); every output, plain
    and lossless, is the reference decoder's at the engine's W sequence, zeros included, in as many
    forwards. (A lossless window's slot 0 is drawn again by the AR step; its window after one starts
    with the token drawn from the row of the token that step returned, as after a prompt.)"""
    from vllm import SamplingParams

    from vllm_wedlm.adapter import scheduler

    monkeypatch.setattr(scheduler, "LOG_INTERVAL_S", float("inf"))  # the log line's counts, never reset
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("ar-steps"),
                                  TinySpec(variant="qwen2", logit_scale=logit_scale))
    config = WeDLMConfig.from_pretrained(checkpoint)
    reference = ReferenceDecoder(load_transformers_model(checkpoint), config.mask_token_id, MAX_WINDOW)
    wedlm = {"decoding": "wedlm", "window_size": "auto", "entropy_threshold": TAU, "ar_step_cost": AR_STEP_COST}
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, extra_args={"wedlm_lossless": lossless})
              for n, lossless in zip(MAX_TOKENS, LOSSLESS, strict=True)]
    with running_llm(checkpoint, dtype="float32", async_scheduling=False, additional_config=wedlm,
                     max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=TOKEN_BUDGET, disable_log_stats=False) as llm:
        counted = record_diffusion_counts(llm)
        vllm_steps = sum(llm.collective_rpc("wedlm_vllm_steps"))
        outputs, by_request, forwards = generate_traced(llm, PROMPTS, params)
        vllm_steps = sum(llm.collective_rpc("wedlm_vllm_steps")) - vllm_steps
        log_counts = llm.llm_engine.engine_core.engine_core.scheduler.commit_stats
    replayed = assert_replayed(reference, outputs, by_request, [StopRule(max_tokens=n) for n in MAX_TOKENS], LOSSLESS)
    assert forwards == sum(expected.num_forwards for expected in replayed)
    # Requests stepped AR and came back to windows, lossless ones among them, and vLLM ran the AR
    # steps whole.
    came_back = [0 in sizes and any(sizes[sizes.index(0):]) for sizes in (by_request[o.request_id] for o in outputs)]
    assert any(came_back) and any(c for c, f in zip(came_back, LOSSLESS, strict=True) if f), by_request
    assert vllm_steps > 0
    # vLLM's diffusion counters (what /metrics serves) count the AR steps' forwards too: every
    # request-forward a denoising step, every token returned committed.
    assert counted["denoising steps"] == forwards
    assert counted["committed tokens"] == sum(len(o.outputs[0].token_ids) for o in outputs)
    # The engine's log line reports how W moved: each request-forward's W, an AR step's W 0 included
    # (the W recorded for each request, less the window planned after its last forward, if any).
    sizes = [by_request[o.request_id] for o in outputs]
    forwarded = Counter(w for s in sizes for w in (s if s[-1] == 0 else s[:-1]))
    assert log_counts.window_sizes == forwarded and forwarded.total() == forwards, (log_counts.window_sizes, forwarded)


@pytest.mark.parametrize("preempted", [False, True], ids=["batch", "preemption"])
def test_fixed_rows_windows_fall_to_w0_and_come_back(tmp_path_factory, monkeypatch, preempted):
    """On fixed window rows a window that commits about one token falls to W 0 by itself (its
    leading run alone, one AR row: ``window_policy.zero_windows``) and comes back (a whole window,
    a probe of its own, every few W 0 windows), where rows cost: the scheduler chooses on a cost
    curve where each row costs a tenth of a step's fixed time (a tiny model's rows are nearly free;
    on the Qwen3-8B shape's curve a batch of 8 windows is below the knee, where W 2 pays, and
    whether a window reaches W 0 then hangs on the timing of its step's output). Every output, plain and
    lossless (which keeps its windows), is the reference decoder's at the engine's W sequence, zeros
    included, in as many forwards; ``preempted``: through at least 10 preemptions, rows costing so
    much that plain windows sit at W 0 but for their probes, so that requests are preempted while at
    W 0 (a window of W 0 re-prefilled draws from its last row)."""
    from vllm import SamplingParams

    from engines import kv_bytes_per_token
    from vllm_wedlm.adapter import scheduler, window_sizer
    from vllm_wedlm.core.window_policy import StepCost

    cost = StepCost(1e-3, 1e-3 if preempted else 1e-4, 0)
    monkeypatch.setattr(scheduler, "step_cost", lambda hf_config, knee=None: cost)
    # Probes in every 4th step rather than every 16th: these requests are short.
    monkeypatch.setattr(window_sizer, "ZERO_PROBE_PERIOD", 4)
    monkeypatch.setattr(scheduler, "LOG_INTERVAL_S", float("inf"))  # the log line's counts, never reset
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("w0"), TinySpec(variant="qwen2", logit_scale=1.0))
    config = WeDLMConfig.from_pretrained(checkpoint)
    reference = ReferenceDecoder(load_transformers_model(checkpoint), config.mask_token_id, MAX_WINDOW)
    wedlm = {"decoding": "wedlm", "window_size": "auto", "entropy_threshold": TAU, "fixed_window_rows": True}
    if preempted:
        prompts, lossless = PREEMPT_PROMPTS, [i % 3 == 1 for i in range(len(PREEMPT_PROMPTS))]
        max_tokens = [PREEMPT_TOKENS] * len(prompts)
        rule = StopRule(max_tokens=PREEMPT_TOKENS, max_model_len=MAX_MODEL_LEN)
        engine = dict(max_model_len=MAX_MODEL_LEN, block_size=BLOCK,
                      kv_cache_memory_bytes=KV_BLOCKS * BLOCK * kv_bytes_per_token(config),
                      max_num_batched_tokens=32 * MAX_WINDOW, long_prefill_token_threshold=CHUNK,
                      enable_chunked_prefill=True, disable_log_stats=False)
    else:
        prompts, lossless, max_tokens = PROMPTS, LOSSLESS, MAX_TOKENS
        engine = dict(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=TOKEN_BUDGET, disable_log_stats=False)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, extra_args={"wedlm_lossless": f})
              for n, f in zip(max_tokens, lossless, strict=True)]
    # In this process, also on a GPU: the scheduler is the one patched above.
    with running_llm(checkpoint, in_process=True, dtype="float32", async_scheduling=True, additional_config=wedlm,
                     **engine) as llm:
        (before,) = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
        counted = record_diffusion_counts(llm)
        outputs, by_request, forwards = generate_traced(llm, prompts, params)
        (after,) = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
        redrawn = llm.collective_rpc("wedlm_row_layouts")[0]["w0_redrawn"]
        log_counts = llm.llm_engine.engine_core.engine_core.scheduler.commit_stats
    rules = [rule] * len(outputs) if preempted else [StopRule(max_tokens=n) for n in max_tokens]
    replayed = assert_replayed(reference, outputs, by_request, rules, lossless)
    assert forwards == sum(expected.num_forwards for expected in replayed)
    sizes = [by_request[o.request_id] for o in outputs]
    # Plain requests fell to W 0 and came back (a whole window after it); lossless ones never did.
    came_back = [0 in s and MAX_WINDOW in s[s.index(0):] for s in sizes]
    assert any(c for c, f in zip(came_back, lossless, strict=True) if not f), by_request
    assert not any(0 in s for s, f in zip(sizes, lossless, strict=True) if f), by_request
    # ... and most of their windows were W 0 (70-74% on the CPU), where a row costs a tenth of a step.
    plain = [w for s, f in zip(sizes, lossless, strict=True) if not f for w in s]
    assert sum(w == 0 for w in plain) > len(plain) / 2, by_request
    # The engine's log line reports how W moved: each request-forward's W (the W recorded for each
    # request, less the window planned after its last forward).
    forwarded = Counter(w for s in sizes for w in s[:-1])
    assert log_counts.window_sizes == forwarded and forwarded.total() == forwards, (log_counts.window_sizes, forwarded)
    zero_share = 100 * forwarded[0] / forwards
    assert f"request-forwards of {log_counts.window_tokens} window tokens); their W: 0 {zero_share:.0f}%, 1 " in (
        log_counts.line()), log_counts.line()
    # ... and vLLM's diffusion counters count them as /metrics does: a W 0 window drawn from a
    # re-prefill's last row is a request-forward too, its draw a committed token.
    assert counted["denoising steps"] == forwards
    assert counted["committed tokens"] == sum(len(o.outputs[0].token_ids) for o in outputs)
    if preempted:  # ... some of them while at W 0
        assert after - before >= 10, f"only {after - before} preemptions: the batch was meant not to fit"
        assert redrawn, redrawn


#: Requests of ``PROMPTS`` that pin their W (``wedlm_window_size``): index -> W (3 is lossless).
PINS = {0: 16, 2: 4, 3: 8, 7: 1}


@pytest.mark.parametrize("fixed_rows", [False, True], ids=["exact-rows", "fixed-rows"])
def test_a_pinned_request_is_never_resized_on_the_default_engine(tmp_path_factory, monkeypatch, fixed_rows):
    """An engine with the default settings runs the adaptive window; a request that pins its W
    (``wedlm_window_size``) keeps it for every window in a batch of requests whose W moves (AR steps
    of the batch on exact rows, W 0 windows and probes on fixed rows, each made to pay here), so its
    output is the reference decoder's at that fixed W, plain and lossless, as on a server of that W;
    the others' are the reference's at their recorded W."""
    from vllm import SamplingParams

    from vllm_wedlm.adapter import scheduler, window_sizer
    from vllm_wedlm.core.window_policy import StepCost

    wedlm = {"decoding": "wedlm", "entropy_threshold": TAU}  # no window_size: the default
    if fixed_rows:  # rows that cost a tenth of a step: W 0 windows pay (test_fixed_rows_windows_fall_to_w0...)
        monkeypatch.setattr(scheduler, "step_cost", lambda hf_config, knee=None: StepCost(1e-3, 1e-4, 0))
        monkeypatch.setattr(window_sizer, "ZERO_PROBE_PERIOD", 4)
        wedlm["fixed_window_rows"] = True
    else:  # an AR step's cost fixed: the choice depends on what windows commit, not on timings
        wedlm["ar_step_cost"] = AR_STEP_COST
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("pinned"), TinySpec(variant="qwen2", logit_scale=1.0))
    config = WeDLMConfig.from_pretrained(checkpoint)
    model = load_transformers_model(checkpoint)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                             extra_args={"wedlm_lossless": f} | ({"wedlm_window_size": PINS[i]} if i in PINS else {}))
              for i, (n, f) in enumerate(zip(MAX_TOKENS, LOSSLESS, strict=True))]
    with running_llm(checkpoint, in_process=True, dtype="float32", async_scheduling=fixed_rows,
                     additional_config=wedlm, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=TOKEN_BUDGET) as llm:
        assert llm.llm_engine.vllm_config.additional_config.get("window_size") is None
        outputs, by_request, _ = generate_traced(llm, PROMPTS, params)
    for i, output in enumerate(outputs):
        sizes = by_request[output.request_id]
        rule, settings = StopRule(max_tokens=MAX_TOKENS[i]), WeDLMParams(TAU, 0.02, lossless=LOSSLESS[i])
        if i in PINS:
            assert set(sizes) == {PINS[i]}, (i, sizes)
            fixed = ReferenceDecoder(model, config.mask_token_id, PINS[i]).generate(
                list(output.prompt_token_ids), rule, settings)
            assert list(output.outputs[0].token_ids) == fixed.token_ids, i
        else:
            replayed = ReferenceDecoder(model, config.mask_token_id, MAX_WINDOW).generate(
                list(output.prompt_token_ids), rule, settings, window_sizes=sizes)
            assert list(output.outputs[0].token_ids) == replayed.token_ids, (i, sizes)
    # The others' W moved (the default is the adaptive window): below the most; on fixed rows to W 0
    # windows of their own; on exact rows never to an AR step of the batch, which would have resized the
    # pinned (request 0 outlives every other: at one token a forward, as here, 120 forwards).
    unpinned = [w for i, o in enumerate(outputs) if i not in PINS for w in by_request[o.request_id]]
    assert min(unpinned) < MAX_WINDOW, unpinned
    assert (0 in unpinned) == fixed_rows, unpinned
