"""``adapter.run_output.append_run`` against vLLM's own per-token loop, on real ``Request`` objects.

The scheduler appends each window's leading run in one pass; every run must leave a request exactly
as vLLM's ``Scheduler._update_request_with_output`` does: the same tokens kept, the same stop
decision, status and reason, the same block hashes (prefix caching).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_wedlm.adapter.run_output import append_run

EOS = 2
BLOCK = 4  # small blocks: runs cross block boundaries often


@pytest.fixture(scope="module")
def block_hasher():
    init_none_hash(sha256_cbor)
    return get_request_block_hasher(BLOCK, sha256_cbor)


def _request(rng: random.Random, block_hasher, settings: dict) -> Request:
    params = SamplingParams(temperature=0.0, **settings)
    params.update_from_generation_config({}, eos_token_id=EOS)
    prompt = [rng.randrange(10, 40) for _ in range(rng.randrange(1, 12))]
    return Request("r", prompt, params, None, block_hasher=block_hasher)


def _state(request: Request) -> tuple:
    return (list(request.output_token_ids), list(request.all_token_ids), list(request.block_hashes),
            request.status, request.stop_reason)


def _settings(rng: random.Random) -> dict:
    settings = {"max_tokens": rng.randrange(1, 40)}
    if rng.random() < 0.4:
        eos_too = [EOS] if rng.random() < 0.3 else []
        settings["stop_token_ids"] = rng.sample(range(10, 40), rng.randrange(1, 3)) + eos_too
    if rng.random() < 0.2:
        settings["ignore_eos"] = True
    if rng.random() < 0.2:
        settings["min_tokens"] = rng.randrange(0, settings["max_tokens"] + 1)
    return settings


@pytest.mark.parametrize("seed", range(6))
def test_runs_end_as_vllm_ends_them(seed, block_hasher):
    rng = random.Random(seed)
    taken = runs = 0
    for _ in range(150):
        settings, max_model_len = _settings(rng), rng.randrange(14, 60)
        ours, theirs = _request(random.Random(seed), block_hasher, settings), _request(random.Random(seed),
                                                                                        block_hasher, settings)
        vllm_loop = SimpleNamespace(max_model_len=max_model_len)
        for _ in range(40):  # runs until a stop (min_tokens can hold one off even past max_model_len)
            # Token ids 10..39 (stop ids among them) and EOS, in runs of 0 to 16 (a window's).
            run = [rng.choice([EOS] + list(range(10, 40))) if rng.random() < 0.1 else rng.randrange(10, 40)
                   for _ in range(rng.randrange(0, 17))]
            got = append_run(ours, list(run), max_model_len)
            expected = Scheduler._update_request_with_output(vllm_loop, theirs, list(run))
            if got is None:  # left to vLLM's loop: only while min_tokens is still ahead
                assert ours.num_output_tokens + 1 < settings.get("min_tokens", 0)
                got = Scheduler._update_request_with_output(vllm_loop, ours, list(run))
            else:
                taken += 1
            assert got == expected
            assert _state(ours) == _state(theirs)
            if got[1]:
                assert ours.is_finished()
                break
        else:
            assert settings.get("min_tokens", 0) > max_model_len - len(ours.prompt_token_ids)
    assert taken > runs / 2  # the fast path decided most runs


def test_stop_reasons(block_hasher):
    rng = random.Random(0)
    request = _request(rng, block_hasher, {"max_tokens": 50, "stop_token_ids": [33]})
    tokens, stopped = append_run(request, [11, 12, 33, 14], 100)
    assert (tokens, stopped, request.status, request.stop_reason) == ([11, 12, 33], True,
                                                                    RequestStatus.FINISHED_STOPPED, 33)
    request = _request(rng, block_hasher, {"max_tokens": 50, "stop_token_ids": [EOS]})
    tokens, stopped = append_run(request, [11, EOS, 12], 100)
    assert (tokens, stopped, request.status, request.stop_reason) == ([11, EOS], True,
                                                                    RequestStatus.FINISHED_STOPPED, None)
    request = _request(rng, block_hasher, {"max_tokens": 3})
    tokens, stopped = append_run(request, [11, 12, 13, 14, EOS], 100)
    assert (tokens, stopped, request.status) == ([11, 12, 13], True, RequestStatus.FINISHED_LENGTH_CAPPED)
