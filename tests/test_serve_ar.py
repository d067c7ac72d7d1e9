"""A real ``vllm serve <tiny WeDLM> --decoding ar`` answers the OpenAI API, streaming included.

The served tokens are checked against transformers' greedy decoding of the same weights, so the
server is known to run the right model the right way, not merely to answer.
"""

from __future__ import annotations

import pytest
import torch

from metric_families import served_families, stock_vllm_families
from servers import model_name, post, running_server, sse_events
from vllm_wedlm.engine_settings import serve_args
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.server_process import prometheus_counters

MAX_TOKENS = 12
ARGS = ("--decoding", "ar", "--dtype", "float32")


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory):
    path = tiny_checkpoints["qwen3"]
    log = tmp_path_factory.mktemp("serve") / "vllm-serve.log"
    with running_server(path, *ARGS, log_path=log) as base:
        yield base, path


@pytest.fixture(scope="module")
def reference(server):
    return load_transformers_model(server[1], dtype=torch.float32)


def greedy(reference, prompt_ids: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = reference.generate(ids, max_new_tokens=max_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt_ids):].tolist()


def test_models_route_lists_the_checkpoint(server):
    base, path = server
    assert model_name(base) == str(path)


def test_completion_matches_transformers_greedy(server, reference):
    base, _ = server
    body = {"prompt": "1, 2, 3, 4", "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    choice = post(base, "/v1/completions", body).json()["choices"][0]
    assert choice["token_ids"] == greedy(reference, choice["prompt_token_ids"])
    assert choice["finish_reason"] in ("length", "stop")


def test_streamed_completion_equals_the_whole_one(server):
    base, _ = server
    body = {"prompt": "The quiet river", "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    whole = post(base, "/v1/completions", body).json()["choices"][0]
    events = sse_events(post(base, "/v1/completions", {**body, "stream": True}, stream=True))
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert len(choices) > 1  # really streamed, not one final blob
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert [t for c in choices for t in (c.get("token_ids") or [])] == whole["token_ids"]
    assert choices[-1]["finish_reason"] == whole["finish_reason"]


def test_chat_completion_and_its_stream(server, reference):
    base, _ = server
    messages = [{"role": "user", "content": "Ada has 12 apples and buys 30 more."}]
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    whole = post(base, "/v1/chat/completions", body).json()
    choice = whole["choices"][0]
    assert choice["message"]["role"] == "assistant"
    # The checkpoint's chat template was applied: the prompt is ChatML with the assistant header.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(server[1])
    assert tokenizer.decode(whole["prompt_token_ids"]) == (
        "<|im_start|>user\nAda has 12 apples and buys 30 more.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert choice["token_ids"] == greedy(reference, whole["prompt_token_ids"])
    events = sse_events(post(base, "/v1/chat/completions", {**body, "stream": True}, stream=True))
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    assert len(deltas) > 1
    assert "".join(deltas) == choice["message"]["content"]


def test_metrics_are_vllms_own_in_ar_mode(server):
    base, path = server
    post(base, "/v1/completions", {"prompt": "1, 2", "max_tokens": 4, "temperature": 0})
    counters = prometheus_counters(base, "vllm:")
    assert counters["vllm:generation_tokens_total"] >= 4
    # Metric by metric what vLLM's own Prometheus logger registers for this server's settings.
    assert served_families(base, "vllm:") == stock_vllm_families(["--model", str(path), "--seed", "0",
                                                                  *serve_args(), *ARGS])
