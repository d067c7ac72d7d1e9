"""A request's tokens depend only on its prompt and settings, through ``vllm.LLM``.

Two things must not change them (DESIGN invariants 4 and 5):

* **Preemption.** A batch that does not fit a small KV cache makes vLLM preempt requests and
  re-prefill them later, some in chunks. The window a request had (filled, not yet committed
  slots included) must resume after the re-prefill exactly where it stopped, so every output
  equals the request decoded alone and the reference decoder's, and the engine forwards exactly
  as many windows as the reference does.
* **max_tokens.** The window keeps W undecided slots up to the end; max_tokens only truncates what
  is committed. So the tokens of ``max_tokens=7`` are the first 7 of ``max_tokens=100``.

Checkpoints: both variants with a sharp lm_head (logit_scale 100) and settings where fills are
partial (asserted: tokens per forward well between one and a full window), so windows really hold
filled, uncommitted slots when they are interrupted. One engine per variant serves every test.
"""

from __future__ import annotations

import pytest

from conftest import VARIANTS, build_checkpoint
from engines import kv_bytes_per_token, running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

LOGIT_SCALE = 100.0
#: variant -> (window W, entropy threshold): partial fills on these checkpoints (about 2 tokens per forward).
SETTINGS = {"qwen2": (16, 0.4), "qwen3": (4, 0.5)}
MAX_MODEL_LEN = 512
BLOCK = 16
KV_BLOCKS = 40  # 640 tokens: one long request or four short ones fit, the batch does not
CHUNK = 64  # prefill chunk (long_prefill_token_threshold): at least a whole window of 2 W
MAX_TOKENS = 96
WORDS = ["Ada", "river", "lamp", "number", "quiet", "reads", "holds", "apples"]
#: 60 short prompts and 4 long ones. Prefills longer than CHUNK tokens (re-prefills after preemption
#: included) run in chunks.
PROMPTS = ([f"{i}, {i + 1}, {WORDS[i % 8]} {WORDS[(i * 3) % 8]} has {i} {WORDS[(i * 5 + 1) % 8]}" for i in range(60)]
           + [", ".join(str(n) for n in range(i * 7, i * 7 + 140)) for i in range(4)])


#: Engines: each variant, and one with fixed window rows, always padded (the layout of async scheduling).
ENGINES = [(variant, False) for variant in VARIANTS] + [("qwen2", True)]


@pytest.fixture(scope="module", params=ENGINES, ids=[v + "-fixed-rows" * fixed for v, fixed in ENGINES])
def engine(request, tmp_path_factory):
    variant, fixed_rows = request.param
    window, tau = SETTINGS[variant]
    path = build_checkpoint(tmp_path_factory.mktemp("invariance"), TinySpec(variant=variant, logit_scale=LOGIT_SCALE))
    config = WeDLMConfig.from_pretrained(path)
    reference = ReferenceDecoder(load_transformers_model(path), config.mask_token_id, window)
    wedlm = {"decoding": "wedlm", "window_size": window, "entropy_threshold": tau}
    if fixed_rows:  # every step pipelined, 2W rows per window (what async scheduling runs at small costs)
        wedlm.update(fixed_window_rows=True, async_padding_tokens=1 << 20)
    with running_llm(path, dtype="float32", additional_config=wedlm, async_scheduling=fixed_rows or None,
                     max_model_len=MAX_MODEL_LEN,
                     kv_cache_memory_bytes=KV_BLOCKS * BLOCK * kv_bytes_per_token(config), block_size=BLOCK,
                     max_num_batched_tokens=32 * window, long_prefill_token_threshold=CHUNK,
                     enable_chunked_prefill=True, disable_log_stats=False) as llm:
        yield llm, reference, WeDLMParams(tau, 0.02)


def greedy(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def preemptions(llm) -> float:
    (value,) = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"]
    return value


def request_forwards(llm) -> int:
    return sum(llm.collective_rpc("wedlm_request_forwards"))


def test_preemption_and_chunked_re_prefill_change_nothing(engine):
    llm, reference, params = engine
    window = reference.window_size
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_seqs == 16 and scheduler.long_prefill_token_threshold == CHUNK
    preempted, forwards = preemptions(llm), request_forwards(llm)
    outputs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
    preempted, forwards = preemptions(llm) - preempted, request_forwards(llm) - forwards
    assert preempted >= 20, f"only {preempted} preemptions: the batch was meant not to fit"
    assert max(len(o.prompt_token_ids) for o in outputs) > 4 * CHUNK  # prefills of 5 chunks

    rule = StopRule(max_tokens=MAX_TOKENS, max_model_len=MAX_MODEL_LEN)
    expected = [reference.generate(list(o.prompt_token_ids), rule, params) for o in outputs]
    equal = sum(list(o.outputs[0].token_ids) == e.token_ids for o, e in zip(outputs, expected, strict=True))
    assert equal == len(PROMPTS), f"{equal}/{len(PROMPTS)} outputs equal the reference after {preempted} preemptions"
    # Partial fills: well above one token per forward, well below a full window per forward
    # (fill-everything commits W per forward after the first).
    tokens_per_forward = len(PROMPTS) * MAX_TOKENS / forwards
    fill_all = MAX_TOKENS / (MAX_TOKENS / window + 1)
    assert 1.5 < tokens_per_forward < 0.6 * fill_all, tokens_per_forward
    # A resumed window is forwarded from where it stopped: no forward is repeated or lost. Async
    # scheduling (fixed window rows on a GPU) may schedule one window more per request, before
    # the step that ends it is back; that window's tokens are dropped.
    extra = len(PROMPTS) if scheduler.async_scheduling else 0
    assert 0 <= forwards - sum(e.num_forwards for e in expected) <= extra

    # Alone (no preemption: each request fits the cache by itself), short and long prompts.
    before = preemptions(llm)
    for i in (0, 1, 2, 60):
        alone = llm.generate([PROMPTS[i]], greedy(MAX_TOKENS), use_tqdm=False)[0]
        assert list(alone.outputs[0].token_ids) == list(outputs[i].outputs[0].token_ids)
    assert preemptions(llm) == before


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_output_does_not_depend_on_max_tokens(engine, prompt):
    """The same request with max_tokens 7, 19, 40 and 100 (submitted together; they fit the cache
    without preemption): each output is a prefix of the longest and equals the reference."""
    llm, reference, params = engine
    lengths = (7, 19, 40, 100)
    before = preemptions(llm)
    outputs = llm.generate([prompt] * len(lengths), [greedy(n) for n in lengths], use_tqdm=False)
    assert preemptions(llm) == before  # only max_tokens differs between these requests
    longest = list(outputs[-1].outputs[0].token_ids)
    assert len(longest) == 100
    for n, out in zip(lengths, outputs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        assert tokens == longest[:n], n
        assert out.outputs[0].finish_reason == "length"
        assert tokens == reference.generate(list(out.prompt_token_ids), StopRule(max_tokens=n), params).token_ids


def test_a_batch_of_full_windows_fills_the_token_budget(engine):
    """max_num_seqs requests whose windows all hold 2 W slots in the same step: fill-everything
    makes every window W filled + W masks, and requests prefilled together stay in step. On the
    W=4 engine all 16 fit the cache, so one step schedules exactly the token budget in windows
    (vLLM's spec-decode bookkeeping then counts budget + 16 rows). Each output is the reference's."""
    from vllm import SamplingParams

    llm, reference, _ = engine
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_seqs * 2 * reference.window_size == scheduler.max_num_batched_tokens
    prompts = [f"{n}," for n in range(10, 10 + scheduler.max_num_seqs)]
    fill_all = {"wedlm_entropy_threshold": 1e9}
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, extra_args=fill_all)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for out in outputs:
        expected = reference.generate(list(out.prompt_token_ids), StopRule(max_tokens=16), WeDLMParams(1e9, 0.02))
        assert list(out.outputs[0].token_ids) == expected.token_ids
