"""WeDLM mode through ``vllm.LLM``: KV reuse, preemption, max_model_len, sampling, bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import build_checkpoint
from engines import kv_bytes_per_token, running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

WINDOW = 8
WEDLM = {"decoding": "wedlm", "window_size": WINDOW}
MAX_MODEL_LEN = 160


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("engine"), TinySpec(variant="qwen3", logit_scale=30.0))
    reference = ReferenceDecoder(load_transformers_model(path), WeDLMConfig.from_pretrained(path).mask_token_id, WINDOW)
    return path, reference


@pytest.fixture(scope="module")
def llm(sharp):
    with running_llm(sharp[0], dtype="float32", additional_config=WEDLM, max_model_len=MAX_MODEL_LEN,
                     enable_prefix_caching=True, block_size=16) as engine:
        yield engine


def greedy(max_tokens, **extra):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra or None)


def test_committed_kv_is_reused_by_prefix_caching(llm, sharp):
    """Invariant 2: a request whose prompt is an earlier prompt plus its WeDLM output reuses the
    KV that WeDLM committed (cache hits past the first prompt) and decodes exactly as the same
    engine with prefix caching off, and as a full recompute (the reference)."""
    path, reference = sharp
    first = llm.generate(["The quiet river reads the number and the lamp holds"], greedy(64), use_tqdm=False)[0]
    prompt = list(first.prompt_token_ids) + list(first.outputs[0].token_ids)
    second = llm.generate([{"prompt_token_ids": prompt}], greedy(24), use_tqdm=False)[0]
    block = llm.llm_engine.vllm_config.cache_config.block_size
    assert block == 16
    assert second.num_cached_tokens >= ((len(prompt) - 1) // block) * block  # every full block
    assert second.num_cached_tokens > len(first.prompt_token_ids)  # hits inside WeDLM's output
    with running_llm(path, dtype="float32", additional_config=WEDLM, max_model_len=MAX_MODEL_LEN,
                     enable_prefix_caching=False, block_size=16) as uncached_engine:
        uncached = uncached_engine.generate([{"prompt_token_ids": prompt}], greedy(24), use_tqdm=False)[0]
    assert not uncached.num_cached_tokens
    assert list(second.outputs[0].token_ids) == list(uncached.outputs[0].token_ids)
    expected = reference.generate(prompt, StopRule(max_tokens=24), WeDLMParams())
    assert list(second.outputs[0].token_ids) == expected.token_ids


def test_windows_stop_at_max_model_len(llm, sharp):
    """Invariant 4: never past max_model_len; the window shrinks to fit."""
    _, reference = sharp
    out = llm.generate(["1, 2, 3"], greedy(10_000, wedlm_entropy_threshold=1e9), use_tqdm=False)[0]
    prompt = list(out.prompt_token_ids)
    assert len(prompt) + len(out.outputs[0].token_ids) == MAX_MODEL_LEN
    expected = reference.generate(prompt, StopRule(max_tokens=10_000, max_model_len=MAX_MODEL_LEN),
                                  WeDLMParams(entropy_threshold=1e9))
    assert list(out.outputs[0].token_ids) == expected.token_ids


def test_seeded_sampling_repeats_and_seeds_differ(llm):
    from vllm import SamplingParams

    def run(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, max_tokens=24, seed=seed, ignore_eos=True)
        return list(llm.generate(["Ada has"], params, use_tqdm=False)[0].outputs[0].token_ids)

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize("kwargs,message", [
    ({"extra_args": {"wedlm_entropy_threshold": -1}}, "entropy_threshold must be a positive"),
    ({"extra_args": {"wedlm_pos_penalty": "big"}}, "pos_penalty must be a finite number"),
    ({"thinking_token_budget": 8}, "thinking_token_budget"),
])
def test_bad_requests_fail_clearly_and_lose_nothing(llm, kwargs, message):
    from vllm import SamplingParams

    with pytest.raises(ValueError, match=message):
        llm.generate(["1, 2"], SamplingParams(max_tokens=4, **kwargs), use_tqdm=False)
    assert len(llm.generate(["1, 2"], greedy(4), use_tqdm=False)[0].outputs[0].token_ids) == 4


def test_preemption_and_chunked_prefill_change_nothing(sharp):
    """Invariant 5: a batch that does not fit the KV cache (so vLLM preempts and re-prefills,
    and the window resumes where it stopped) gives each request exactly what it gets alone. The
    token budget of 128 also splits the long prompt into chunked prefills (which commit nothing).
    test_window_invariance.py does the same with many requests and partial fills."""
    path, reference = sharp
    bytes_per_token = kv_bytes_per_token(WeDLMConfig.from_pretrained(path))
    prompts = [f"{i}, {i + 1}, {i + 2}, Ada has {i} apples" for i in range(7)]
    prompts.append(", ".join(str(i) for i in range(1, 70)))  # longer than the token budget
    with running_llm(path, dtype="float32", additional_config=WEDLM, max_model_len=MAX_MODEL_LEN,
                     kv_cache_memory_bytes=3 * MAX_MODEL_LEN * bytes_per_token, block_size=16,
                     max_num_batched_tokens=128, enable_chunked_prefill=True,
                     disable_log_stats=False) as small:
        outputs = small.generate(prompts, greedy(96), use_tqdm=False)
        preemptions = preempted(small)
        assert preemptions > 0, "the batch was meant to force preemption"
        # Penalised requests (plain and lossless: each row's penalties count the tokens it sees, kept
        # by position across the preemption) give what they give alone.
        penalised = [greedy(96, **({"wedlm_lossless": True} if i % 2 else {})) for i in range(len(prompts))]
        for params in penalised:
            params.repetition_penalty, params.presence_penalty, params.frequency_penalty = 1.3, 0.5, 0.5
        batch = small.generate(prompts, penalised, use_tqdm=False)
        assert preempted(small) > preemptions
        alone = [small.generate([prompt], params, use_tqdm=False)[0] for prompt, params in zip(prompts, penalised,
                                                                                                   strict=True)]
    assert [out.outputs[0].token_ids for out in batch] == [out.outputs[0].token_ids for out in alone]
    assert [out.outputs[0].token_ids for out in batch] != [out.outputs[0].token_ids for out in outputs]
    assert max(len(out.prompt_token_ids) for out in outputs) > 128
    for out in outputs:
        rule = StopRule(max_tokens=96, max_model_len=MAX_MODEL_LEN)
        expected = reference.generate(list(out.prompt_token_ids), rule, WeDLMParams())
        assert list(out.outputs[0].token_ids) == expected.token_ids


def preempted(llm) -> float:
    return next(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


@pytest.fixture(scope="module")
def budget_64(sharp):
    # Without prefix caching: each test's prompt is computed whole, not from an earlier one's KV.
    with running_llm(sharp[0], dtype="float32", additional_config=WEDLM, max_model_len=MAX_MODEL_LEN,
                     max_num_batched_tokens=64, enable_chunked_prefill=True, block_size=16,
                     enable_prefix_caching=False) as engine:
        yield engine


@pytest.mark.parametrize(("prompt_tokens", "prefill_only_steps"), [(10, 0), (100, 1), (128, 2)])
def test_a_first_window_rides_with_the_end_of_its_prompt(sharp, budget_64, prompt_tokens, prefill_only_steps):
    """The forward that ends a prompt's prefill carries the request's first window
    (adapter/scheduler.py), so the prefill costs no step of its own: with a token budget of 64,
    a 10-token prompt takes no step without a window, a 100-token one one (its first chunk), and a
    128-token one two, its last chunk leaving no room (the window comes the step after, as before).
    The tokens stay the reference decoder's, which forwards the first window after the prefill."""
    from vllm_wedlm.evaluation import graph_modes, request_forwards

    _, reference = sharp
    engine = budget_64
    prompt = engine.get_tokenizer()(", ".join(str(i) for i in range(1, 200))).input_ids[:prompt_tokens]
    steps, forwards = sum(graph_modes(engine).values()), request_forwards(engine)
    out = engine.generate([{"prompt_token_ids": prompt}], greedy(24), use_tqdm=False)[0]
    steps, forwards = sum(graph_modes(engine).values()) - steps, request_forwards(engine) - forwards
    assert len(out.prompt_token_ids) == prompt_tokens
    assert forwards > 1
    assert steps == forwards + prefill_only_steps
    expected = reference.generate(prompt, StopRule(max_tokens=24, max_model_len=MAX_MODEL_LEN), WeDLMParams())
    assert list(out.outputs[0].token_ids) == expected.token_ids


def test_the_runner_applies_custom_logits_processors_only(sharp):
    """The WeDLM sampler applies vLLM's built-in min_p, logit_bias and min_tokens itself; any other
    processor (named in --logits-processors, or an installed plugin the front end never sees) the
    runner applies to every row (tests/test_custom_logits_processors.py), argmax-moving ones first,
    and on fixed window rows it refuses them."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors
    from vllm.v1.sample.logits_processor.interface import LogitsProcessor

    from vllm_wedlm.adapter.custom_processors import custom_processors, refuse_on_fixed_rows
    from vllm_wedlm.adapter.request_validator import WeDLMRequestValidator

    config = EngineArgs(model=str(sharp[0]), max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 26,
                        additional_config={"decoding": "wedlm"}).create_engine_config()

    class Uppercase(LogitsProcessor):
        def __init__(self, invariant: bool):
            self.invariant = invariant

        def apply(self, logits):
            return logits

        def is_argmax_invariant(self):
            return self.invariant

        def update_state(self, batch_update):
            pass

    stock = [cls(config, torch.device("cpu"), False) for cls in BUILTIN_LOGITS_PROCESSORS]
    validator = WeDLMRequestValidator(config, "cpu", False)
    assert custom_processors(LogitsProcessors([*stock, validator])) == []
    invariant, moving = Uppercase(True), Uppercase(False)
    assert custom_processors(LogitsProcessors([invariant, *stock, validator, moving])) == [moving, invariant]
    refuse_on_fixed_rows([])
    with pytest.raises(ValueError, match=r"custom logits processors \(Uppercase\).*synchronous scheduling"):
        refuse_on_fixed_rows(["Uppercase"])


def test_wedlm_on_a_non_wedlm_model_is_refused(sharp, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    qwen3 = tmp_path / "qwen3"
    shutil.copytree(sharp[0], qwen3)
    config = json.loads((qwen3 / "config.json").read_text())
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    config.pop("auto_map")
    (qwen3 / "config.json").write_text(json.dumps(config))
    args = EngineArgs(model=str(qwen3), max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 26,
                      additional_config={"decoding": "wedlm"})
    with pytest.raises(ValueError, match="needs a WeDLM model .* is Qwen3ForCausalLM"):
        args.create_engine_config()
