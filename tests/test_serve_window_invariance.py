"""A request's tokens depend only on its prompt and settings, through a real ``vllm serve``.

The same two properties as test_window_invariance.py (which see), under concurrent streams of
the OpenAI completions API: many streams that do not fit a small KV cache (so vLLM preempts
and re-prefills, in chunks) each get exactly the reference decoder's tokens, and a request's
tokens are a prefix of the same request with a larger max_tokens. Other windows and thresholds
than the vllm.LLM tests, on both checkpoint variants.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import VARIANTS, build_checkpoint
from engines import kv_bytes_per_token
from servers import model_name, post, running_server, sse_events
from test_window_invariance import BLOCK, CHUNK, KV_BLOCKS, LOGIT_SCALE, MAX_MODEL_LEN, PROMPTS
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule
from vllm_wedlm.server_process import prometheus_counters

#: variant -> (window W, entropy threshold): partial fills on these checkpoints (2 to 3 tokens per forward).
SETTINGS = {"qwen2": (8, 0.7), "qwen3": (16, 0.4)}
MAX_TOKENS = 96
STREAMS = PROMPTS[:46] + PROMPTS[-2:]  # 48, two of them long (prefills of 5 chunks)
PREEMPTIONS = "vllm:num_preemptions_total"
FORWARDS = "vllm:diffusion_num_denoising_steps_total"  # request-forwards: one window of one request
COMMITTED = "vllm:diffusion_num_committed_tokens_total"


@pytest.fixture(scope="module", params=VARIANTS)
def server(request, tmp_path_factory):
    variant = request.param
    window, tau = SETTINGS[variant]
    root = tmp_path_factory.mktemp("serve-invariance")
    path = build_checkpoint(root, TinySpec(variant=variant, logit_scale=LOGIT_SCALE))
    config = WeDLMConfig.from_pretrained(path)
    reference = ReferenceDecoder(load_transformers_model(path), config.mask_token_id, window)
    args = ["--decoding", "wedlm", "--wedlm-window-size", str(window), "--wedlm-entropy-threshold", str(tau),
            "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--block-size", str(BLOCK),
            "--kv-cache-memory-bytes", str(KV_BLOCKS * BLOCK * kv_bytes_per_token(config)),
            "--max-num-batched-tokens", str(32 * window), "--long-prefill-token-threshold", str(CHUNK),
            "--enable-chunked-prefill"]
    with running_server(path, *args, log_path=root / "vllm-serve.log") as url:
        yield url, reference, WeDLMParams(tau, 0.02)


def stream(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy completion: its prompt ids, the token ids of all its chunks, and how it ended."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True}
    choices = [e["choices"][0] for e in sse_events(post(url, "/v1/completions", body, stream=True)) if e["choices"]]
    (prompt_ids,) = [c["prompt_token_ids"] for c in choices if c.get("prompt_token_ids")]
    tokens = [t for c in choices for t in c.get("token_ids") or []]
    return {"prompt_token_ids": prompt_ids, "token_ids": tokens, "finish_reason": choices[-1]["finish_reason"]}


def concurrently(url: str, requests: list[tuple[str, int]]) -> list[dict]:
    model = model_name(url)
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda r: stream(url, model, *r), requests))


def counters_after(url: str, before: dict[str, float], committed: int) -> dict[str, float]:
    """Counter increments since ``before``, once the frontend has recorded ``committed`` tokens
    (it records a step's stats just after handing out the step's outputs)."""
    deadline = time.monotonic() + 30
    while True:
        delta = {k: v - before.get(k, 0.0) for k, v in prometheus_counters(url, "vllm:").items()}
        if delta.get(COMMITTED, 0.0) >= committed or time.monotonic() > deadline:
            return delta


def test_concurrent_streams_survive_preemption(server):
    url, reference, params = server
    window = reference.window_size
    before = prometheus_counters(url, "vllm:")
    results = concurrently(url, [(prompt, MAX_TOKENS) for prompt in STREAMS])
    delta = counters_after(url, before, len(STREAMS) * MAX_TOKENS)
    assert delta[PREEMPTIONS] >= 20, f"only {delta[PREEMPTIONS]} preemptions: the streams were meant not to fit"
    assert max(len(r["prompt_token_ids"]) for r in results) > 4 * CHUNK

    rule = StopRule(max_tokens=MAX_TOKENS, max_model_len=MAX_MODEL_LEN)
    expected = [reference.generate(r["prompt_token_ids"], rule, params) for r in results]
    equal = sum(r["token_ids"] == e.token_ids for r, e in zip(results, expected, strict=True))
    assert equal == len(STREAMS), f"{equal}/{len(STREAMS)} equal the reference after {delta[PREEMPTIONS]} preemptions"
    assert all(r["finish_reason"] == "length" for r in results)
    # Partial fills (between one token and a full window per forward), and a resumed window is
    # forwarded from where it stopped: the engine forwards exactly the reference's windows.
    forwards = sum(e.num_forwards for e in expected)
    tokens_per_forward = len(STREAMS) * MAX_TOKENS / forwards
    assert 1.5 < tokens_per_forward < 0.6 * MAX_TOKENS / (MAX_TOKENS / window + 1), tokens_per_forward
    assert delta[FORWARDS] == forwards


def test_streams_do_not_depend_on_max_tokens(server):
    """Each prompt with max_tokens 7, 19, 40 and 100, streamed concurrently (four fit the cache, so
    nothing is preempted): every stream is a prefix of the longest and equals the reference."""
    url, reference, params = server
    lengths = (7, 19, 40, 100)
    for prompt in STREAMS[3:6]:
        before = prometheus_counters(url, PREEMPTIONS).get(PREEMPTIONS, 0.0)
        results = concurrently(url, [(prompt, n) for n in lengths])
        assert prometheus_counters(url, PREEMPTIONS)[PREEMPTIONS] == before
        longest = results[-1]["token_ids"]
        assert len(longest) == 100
        for n, result in zip(lengths, results, strict=True):
            assert result["token_ids"] == longest[:n], (prompt, n)
            assert result["finish_reason"] == "length"
            rule = StopRule(max_tokens=n)
            assert result["token_ids"] == reference.generate(result["prompt_token_ids"], rule, params).token_ids
