"""Custom vLLM logits processors (``--logits-processors``) in WeDLM mode.

The processors (``example_processors.py``) see, for each row of a window, the tokens left of it in
logical order (``adapter/custom_processors.py``). So greedy lossless WeDLM and per-request AR must
equal an ``--decoding ar`` engine with the same processors token for token, beside requests that do
not ask for them (which must not change); a plain window must obey a processor that reads only the
row's output index exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests
import torch

from conftest import build_checkpoint
from engines import running_llm
from servers import model_name, running_server, sse_events
from vllm_wedlm.adapter.custom_processors import apply_custom, ranks
from vllm_wedlm.checkpoints.tiny import TinySpec

PROCESSORS = ["example_processors:ForceTokens", "example_processors:NoRepeatBigram"]
WINDOW = 8
MAX_TOKENS = 32
PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
MODES = ("lossless", "ar", "plain", "unasked")


def params(mode: str, asks: dict | None = None):
    from vllm import SamplingParams

    extra = {"wedlm_lossless": True} if mode == "lossless" else {"wedlm_decoding": "ar"} if mode == "ar" else {}
    if mode != "unasked":
        extra = {**extra, **(asks or {})}
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, extra_args=extra or None)


def token_ids(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


def forced(baseline: list[int]) -> list[int]:
    """``force_tokens`` pairs that change ``baseline``: at output indices 2, 9 and 20, a token it
    does not have there (the token after it in the text, or one above it)."""
    pairs = []
    for index in (2, 9, 20):
        token = baseline[index + 1] if baseline[index + 1] != baseline[index] else baseline[index] + 1
        pairs += [index, token]
    return pairs


def test_ranks_number_each_requests_rows():
    assert ranks(np.array([0, 0, 1, 2, 2, 2])).tolist() == [0, 1, 0, 0, 1, 2]
    assert ranks(np.array([2, 0, 2, 1, 0])).tolist() == [0, 0, 1, 0, 1]
    assert ranks(np.zeros(0, np.int64)).tolist() == []


def test_each_row_sees_its_own_context_and_the_lists_come_back():
    """Round k shows the processors each request's k-th row, the batch row of its request, with its
    output list set to the row's context; every list is as before afterwards."""
    outputs = [[5, 6], [7], []]
    seen = []

    class Recorder:
        def apply(self, logits):
            seen.append(([list(tokens) for tokens in outputs], logits[:, 0].tolist()))
            return logits + torch.arange(3.0)[:, None]  # row i of the batch: + i

    logits = torch.arange(5.0)[:, None].repeat(1, 4)  # [5, 4], row r holds r
    row_requests = np.array([0, 0, 0, 1, 2])
    contexts = [(2, []), (2, [9]), (2, [9, 1]), (1, [3]), (0, [])]
    edited = apply_custom([Recorder()], logits.clone(), row_requests, contexts, outputs)
    assert outputs == [[5, 6], [7], []]
    assert seen == [([[5, 6], [7, 3], []], [0.0, 3.0, 4.0]), ([[5, 6, 9], [7], []], [1.0, 0.0, 0.0]),
                    ([[5, 6, 9, 1], [7], []], [2.0, 0.0, 0.0])]
    assert torch.equal(edited, logits + torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0])[:, None])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("processors"), TinySpec(variant="qwen3", logit_scale=30.0))
    runs: dict = {"path": path}
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}, logits_processors=PROCESSORS) as ar:
        runs["engine_greedy"] = token_ids(ar.generate(PROMPTS, params("plain"), use_tqdm=False))
        runs["asks"] = {"force": [{"force_tokens": forced(ids)} for ids in runs["engine_greedy"]],
                        "bigram": [{"no_repeat_bigram": True}] * len(PROMPTS)}
        for name, asks in runs["asks"].items():
            runs[f"engine_{name}"] = token_ids(ar.generate(PROMPTS, [params("plain", a) for a in asks], use_tqdm=False))
    config = {"decoding": "wedlm", "window_size": WINDOW}
    with running_llm(path, dtype="float32", additional_config=config, logits_processors=PROCESSORS) as llm:
        runs["plain_greedy"] = token_ids(llm.generate(PROMPTS, params("plain"), use_tqdm=False))
        for name, asks in runs["asks"].items():
            # Every mode, and plain requests that do not ask, in one batch.
            outputs = token_ids(llm.generate([p for p in PROMPTS for _ in MODES],
                                             [params(m, a) for a in asks for m in MODES], use_tqdm=False))
            for i, mode in enumerate(MODES):
                runs[f"{mode}_{name}"] = outputs[i::len(MODES)]
    return runs


@pytest.mark.parametrize("name", ["force", "bigram"])
def test_lossless_and_per_request_ar_equal_the_ar_engine_with_the_same_processor(runs, name):
    assert runs[f"engine_{name}"] != runs["engine_greedy"]  # the processor changes AR's text
    assert runs[f"lossless_{name}"] == runs[f"engine_{name}"]
    assert runs[f"ar_{name}"] == runs[f"engine_{name}"]


@pytest.mark.parametrize("name", ["force", "bigram"])
def test_requests_that_do_not_ask_do_not_change(runs, name):
    assert runs[f"unasked_{name}"] == runs["plain_greedy"]


def test_plain_windows_obey_a_processor_of_the_output_index(runs):
    for ids, asks in zip(runs["plain_force"], runs["asks"]["force"], strict=True):
        pairs = asks["force_tokens"]
        assert len(ids) == MAX_TOKENS
        assert all(ids[index] == token for index, token in zip(pairs[::2], pairs[1::2], strict=True))
    assert runs["plain_force"] != runs["plain_greedy"]
    # The bigram ban reaches plain rows too (each sees the committed output and the fills to its left).
    assert runs["plain_bigram"] != runs["plain_greedy"]


def test_fixed_window_rows_refuse_custom_processors(runs):
    """Fixed window rows (async scheduling) do not know a window's tokens on the host, so a
    processor could not see its row's context: the engine refuses to start, and says what works."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(runs["path"]), max_model_len=256, enforce_eager=True, kv_cache_memory_bytes=1 << 26,
                      additional_config={"decoding": "wedlm", "fixed_window_rows": True},
                      logits_processors=PROCESSORS)
    with pytest.raises(ValueError, match=r"custom logits processors \(example_processors:ForceTokens.*synchronous"):
        args.create_engine_config()


def test_custom_processors_over_http(runs, tmp_path):
    """A WeDLM server started with --logits-processors applies them to completions, streamed and
    whole, per request through vllm_xargs; a request with an invalid setting gets a 400 and the
    server keeps serving."""
    import os
    from pathlib import Path

    tests = str(Path(__file__).parent)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    prompt, pairs = PROMPTS[0], runs["asks"]["force"][0]["force_tokens"]
    with running_server(runs["path"], "--dtype", "float32", "--decoding", "wedlm", "--wedlm-window-size", str(WINDOW),
                        "--logits-processors", *PROCESSORS, log_path=tmp_path / "server.log", env=env) as base:
        body = {"model": model_name(base), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True,
                "vllm_xargs": {"force_tokens": pairs, "wedlm_lossless": True}}
        whole = requests.post(f"{base}/v1/completions", json=body, timeout=300)
        assert whole.status_code == 200, whole.text
        ids = whole.json()["choices"][0]["token_ids"]
        assert ids == runs["engine_force"][0]
        streamed = requests.post(f"{base}/v1/completions", json={**body, "stream": True}, stream=True, timeout=300)
        text = "".join(event["choices"][0]["text"] for event in sse_events(streamed) if event["choices"])
        assert text == whole.json()["choices"][0]["text"]
        bad = requests.post(f"{base}/v1/completions", json={**body, "vllm_xargs": {"force_tokens": [1]}}, timeout=300)
        assert bad.status_code == 400 and "force_tokens" in bad.text
        again = requests.post(f"{base}/v1/completions", json=body, timeout=300)
        assert again.status_code == 200 and again.json()["choices"][0]["token_ids"] == ids
