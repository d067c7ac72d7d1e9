"""A real ``vllm serve <tiny WeDLM> --decoding wedlm``: OpenAI API, streaming, stops, bad input.

The served checkpoint's EOS is set to a token that greedy WeDLM decoding commits in the middle
of a window, so the EOS case is real rather than left to chance.
"""

from __future__ import annotations

import json
import shutil
import threading

import pytest
import requests

from batch_spread import assert_match, largest_spread
from conftest import build_checkpoint
from metric_families import served_families, stock_vllm_families
from servers import model_name, post, running_server, sse_events
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.engine_settings import serve_args
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule
from vllm_wedlm.server_process import prometheus_counters

WINDOW = 8
FILL_ALL = {"wedlm_entropy_threshold": 1e9}  # every mask fills: whole windows commit at once
PROMPT = "1, 2, 3, 4, 5"
# No free whitespace in structured JSON: the random model would fill its budget with it.
ARGS = ("--decoding", "wedlm", "--wedlm-window-size", str(WINDOW), "--dtype", "float32",
        "--wedlm-entropy-threshold", "0.4",
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
        "--enable-auto-tool-choice", "--tool-call-parser", "pythonic")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-wedlm")
    base = build_checkpoint(root, TinySpec(variant="qwen3", logit_scale=30.0))
    reference = ReferenceDecoder(load_transformers_model(base), WeDLMConfig.from_pretrained(base).mask_token_id, WINDOW)
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(base).encode(PROMPT)
    committed = reference.generate(prompt_ids, StopRule(max_tokens=24), WeDLMParams(1e9, 0.02)).token_ids
    # An EOS that first appears mid-window (position 3 of the first committed window of 8).
    eos = next(t for i, t in enumerate(committed) if i >= 3 and i % WINDOW != 0 and committed.index(t) == i)
    path = root / "served"
    shutil.copytree(base, path)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((path / name).read_text())
        config["eos_token_id"] = eos
        (path / name).write_text(json.dumps(config))
    log = root / "vllm-serve.log"
    with running_server(path, *ARGS, log_path=log, env={"VLLM_LOG_STATS_INTERVAL": "1"}) as url:
        yield url, reference, eos, log


#: Prompts that share PROMPT's steps when ``ar_spread`` sends them in one completion request.
OTHERS = ("The quiet river reads the number", "Gus", "Ada has 12 apples and")


@pytest.fixture(scope="module")
def ar_spread(setup):
    """How far a per-request AR request's log-probs move on this server with what shares its steps
    (tests/batch_spread.py): PROMPT alone, then after one, two and three other prompts in one
    completion request (vLLM schedules them together), for each kind of log-probs the tests ask."""
    url, *_ = setup
    asks = ({"max_tokens": 24, "ignore_eos": True, "logprobs": 2}, {"max_tokens": 8, "prompt_logprobs": 3},
            {"max_tokens": 1, "echo": True, "logprobs": 1})
    spreads = []
    for ask in asks:
        layouts = []
        for others in range(len(OTHERS) + 1):
            body = {"prompt": [*OTHERS[:others], PROMPT], "temperature": 0, "return_token_ids": True, **ask,
                    "vllm_xargs": {"wedlm_decoding": "ar"}}
            choice = next(c for c in post(url, "/v1/completions", body).json()["choices"] if c["index"] == others)
            layouts.append([choice["logprobs"], choice.get("prompt_logprobs"), choice["token_ids"]])
        spreads.append(largest_spread(layouts))
    return max(spreads)


def completion(url, **body):
    body = {"prompt": PROMPT, "temperature": 0, "return_token_ids": True, **body}
    return post(url, "/v1/completions", body).json()["choices"][0]


def expect(reference, prompt_ids, max_tokens, tau=0.4, stop=(), lossless=False):
    rule = StopRule(max_tokens=max_tokens, stop_token_ids=frozenset(stop))
    return reference.generate(prompt_ids, rule, WeDLMParams(tau, 0.02, lossless)).token_ids


def test_completion_equals_reference_with_server_and_request_knobs(setup):
    url, reference, *_ = setup
    choice = completion(url, max_tokens=20, ignore_eos=True)
    assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 20)
    choice = completion(url, max_tokens=20, ignore_eos=True, vllm_xargs=FILL_ALL)
    assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 20, tau=1e9)
    # One fill per step (tau None): JSON null is no vllm_xargs value vLLM takes, the word "none" is.
    choice = completion(url, max_tokens=20, ignore_eos=True, vllm_xargs={"wedlm_entropy_threshold": "none"})
    assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 20, tau=None)


def test_eos_mid_window_ends_the_request_there(setup):
    url, reference, eos, _ = setup
    choice = completion(url, max_tokens=24, vllm_xargs=FILL_ALL)
    expected = expect(reference, choice["prompt_token_ids"], 24, tau=1e9, stop=[eos])
    assert expected[-1] == eos and len(expected) % WINDOW != 0  # really mid-window
    assert choice["token_ids"] == expected
    assert choice["finish_reason"] == "stop"


def test_lossless_requests_through_vllm_xargs(setup):
    """``vllm_xargs: {"wedlm_lossless": true}``: the reference's lossless output (which is AR
    decoding's, tests/test_lossless_core.py), EOS included, streamed or not."""
    url, reference, eos, _ = setup
    lossless = {"wedlm_lossless": True, **FILL_ALL}
    choice = completion(url, max_tokens=24, vllm_xargs=lossless)
    expected = expect(reference, choice["prompt_token_ids"], 24, tau=1e9, stop=[eos], lossless=True)
    assert choice["token_ids"] == expected
    assert choice["finish_reason"] == ("stop" if expected[-1] == eos else "length")
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 24, "ignore_eos": True, "vllm_xargs": lossless}
    events = sse_events(post(url, "/v1/completions", {**body, "stream": True}, stream=True))
    whole = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == whole


def test_logit_bias_allowed_token_ids_min_p_and_min_tokens_over_http(setup):
    """OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids``, ``min_p`` and ``min_tokens`` in WeDLM mode (tests/
    test_logit_edits.py has the engine-level proof): lossless equals per-request AR with the same
    edits, streamed or not; plain WeDLM keeps its tokens inside them; min_p 1 samples greedily."""
    from collections import Counter

    url, *_ = setup
    free = completion(url, max_tokens=24, ignore_eos=True)["token_ids"]
    banned = Counter(free).most_common(1)[0][0]
    allowed = sorted((set(free) | set(range(100, 140))) - {banned})
    edits = {"max_tokens": 24, "ignore_eos": True, "logit_bias": {str(banned): -100}, "allowed_token_ids": allowed}
    ar = completion(url, vllm_xargs={"wedlm_decoding": "ar"}, **edits)["token_ids"]
    lossless = completion(url, vllm_xargs={"wedlm_lossless": True}, **edits)
    plain = completion(url, **edits)["token_ids"]
    assert lossless["token_ids"] == ar != free[:len(ar)]
    for ids in (ar, plain):
        assert len(ids) == 24 and banned not in ids and set(ids) <= set(allowed)
    body = {"prompt": PROMPT, "temperature": 0, "vllm_xargs": {"wedlm_lossless": True}, "stream": True, **edits}
    events = sse_events(post(url, "/v1/completions", body, stream=True))
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == lossless["text"]
    sampled = completion(url, max_tokens=24, ignore_eos=True, temperature=1.0, min_p=1.0, seed=5)
    assert sampled["token_ids"] == free
    held = {"max_tokens": 24, "ignore_eos": True, "min_tokens": 12, "stop_token_ids": [free[1]]}
    answers = [completion(url, vllm_xargs=xargs, **held)["token_ids"]
               for xargs in ({"wedlm_decoding": "ar"}, {"wedlm_lossless": True}, {})]
    assert answers[0] == answers[1] and all(len(ids) >= 12 and free[1] not in ids[:12] for ids in answers)


def test_penalties_and_bad_words_over_http(setup):
    """OpenAI's ``presence_penalty`` / ``frequency_penalty`` and vLLM's ``repetition_penalty`` and
    ``bad_words`` in WeDLM mode (tests/test_request_surface.py has the engine-level proof against an
    AR engine): lossless equals per-request AR, streamed or not, and both differ from the unedited
    text; so does plain WeDLM, which never writes a one-token bad word."""
    from collections import Counter

    url, *_ = setup
    free = completion(url, max_tokens=24, ignore_eos=True)["token_ids"]
    top = Counter(free).most_common(1)[0][0]
    word = post(url, "/detokenize", {"tokens": [top]}).json()["prompt"]
    assert [top] in (post(url, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
                     for text in (word.lstrip(), " " + word.lstrip()))  # one of vLLM's two spellings of it
    knobs = {"max_tokens": 24, "ignore_eos": True, "presence_penalty": 0.8, "frequency_penalty": 0.6,
             "repetition_penalty": 1.3, "bad_words": [word]}
    ar = completion(url, vllm_xargs={"wedlm_decoding": "ar"}, **knobs)["token_ids"]
    unedited_ar = completion(url, vllm_xargs={"wedlm_decoding": "ar"}, max_tokens=24, ignore_eos=True)
    lossless = completion(url, vllm_xargs={"wedlm_lossless": True}, **knobs)
    assert lossless["token_ids"] == ar != unedited_ar["token_ids"]
    plain = completion(url, **knobs)["token_ids"]
    assert plain != free and top not in plain and top not in ar
    body = {"prompt": PROMPT, "temperature": 0, "vllm_xargs": {"wedlm_lossless": True}, "stream": True, **knobs}
    events = sse_events(post(url, "/v1/completions", body, stream=True))
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == lossless["text"]


def test_logprobs_and_echo_over_http(setup, ar_spread):
    """``logprobs`` of generated tokens: a lossless request's equal a per-request AR one's (AR's own rows;
    to AR's own spread between batch layouts, ``ar_spread``), streamed or not; with ``echo`` and one
    token, as lm-eval scores a continuation, the prompt's come too. (A plain request asking for them
    gets a 400: test_bad_requests_get_a_400...)"""
    url, *_ = setup
    answers = [completion(url, max_tokens=24, ignore_eos=True, logprobs=2, vllm_xargs=xargs)
               for xargs in ({"wedlm_lossless": True}, {"wedlm_decoding": "ar"})]
    lossless, ar = (answer["logprobs"] for answer in answers)
    assert_match(lossless, ar, ar_spread, "lossless")
    assert len(lossless["token_logprobs"]) == 24
    assert all(top for top in lossless["top_logprobs"])  # keyed by text: tokens of one text share a key
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 24, "ignore_eos": True, "logprobs": 2, "stream": True,
            "vllm_xargs": {"wedlm_lossless": True}}
    events = [e["choices"][0] for e in sse_events(post(url, "/v1/completions", body, stream=True)) if e["choices"]]
    assert [x for e in events for x in e["logprobs"]["token_logprobs"]] == lossless["token_logprobs"]
    scored = [completion(url, max_tokens=1, echo=True, logprobs=1, vllm_xargs=xargs)
              for xargs in ({"wedlm_lossless": True}, {"wedlm_decoding": "ar"})]
    assert_match(scored[0]["logprobs"], scored[1]["logprobs"], ar_spread, "echo")
    values = scored[0]["logprobs"]["token_logprobs"]
    assert len(values) == len(scored[0]["prompt_token_ids"]) + 1 and values[0] is None
    assert all(isinstance(value, float) and value <= 0 for value in values[1:])


TOOL = {"type": "function", "function": {
    "name": "paint", "description": "Paint the fence.",
    "parameters": {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
                   "required": ["colour"], "additionalProperties": False}}}


def test_structured_outputs_and_tool_calls_over_http(setup):
    """A JSON schema (``response_format``), a choice, and chat tool calls with ``tool_choice`` named or
    required, in WeDLM mode (tests/test_structured_outputs.py and test_grammar_windows.py have the
    engine-level proof): a plain request decodes in windows under the grammar, its output valid and
    streamed as returned whole; a lossless one equals a per-request AR one."""
    url, *_ = setup
    schema = {"type": "json_schema", "json_schema": {"name": "fence", "schema": TOOL["function"]["parameters"]}}
    body = {"messages": [{"role": "user", "content": "Paint it."}], "temperature": 0, "max_tokens": 48,
            "response_format": schema}
    answers = [post(url, "/v1/chat/completions", {**body, "vllm_xargs": xargs}).json()["choices"][0]
               for xargs in ({}, {"wedlm_lossless": True}, {"wedlm_decoding": "ar"})]
    assert answers[1]["message"]["content"] == answers[2]["message"]["content"]
    for answer in answers:
        assert json.loads(answer["message"]["content"])["colour"] in ("red", "green", "blue")
    events = sse_events(post(url, "/v1/chat/completions", {**body, "stream": True}, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == (
        answers[0]["message"]["content"])
    choice = completion(url, max_tokens=8, structured_outputs={"choice": ["left", "right"]})["text"]
    assert choice in ("left", "right")
    chat = {"messages": [{"role": "user", "content": "Paint the fence."}], "temperature": 0, "max_tokens": 64,
            "tools": [TOOL]}
    for tool_choice in ({"type": "function", "function": {"name": "paint"}}, "required"):
        answer = post(url, "/v1/chat/completions", {**chat, "tool_choice": tool_choice}).json()
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "paint" and json.loads(call["arguments"])["colour"] in ("red", "green", "blue")


def test_prompt_logprobs_over_http(setup, ar_spread):
    """vLLM's ``prompt_logprobs``: the prefill's, the same for a plain WeDLM request (whose first
    window rides with the prompt), a lossless one and a per-request AR one (to AR's own spread
    between batch layouts, ``ar_spread``)."""
    url, *_ = setup
    answers = [completion(url, max_tokens=8, prompt_logprobs=3, vllm_xargs=xargs)
               for xargs in ({}, {"wedlm_lossless": True}, {"wedlm_decoding": "ar"})]
    first = answers[0]["prompt_logprobs"]
    assert first[0] is None and len(first) == len(answers[0]["prompt_token_ids"])
    assert all(len(position) >= 3 for position in first[1:])
    for answer in answers[1:]:
        assert_match(answer["prompt_logprobs"], first, ar_spread)


def test_stop_token_ids_and_max_tokens_are_exact(setup):
    url, reference, eos, _ = setup
    full = completion(url, max_tokens=24, ignore_eos=True, vllm_xargs=FILL_ALL)["token_ids"]
    stop = next(t for i, t in enumerate(full) if i >= 9 and t != eos and full.index(t) == i)
    choice = completion(url, max_tokens=24, ignore_eos=True, stop_token_ids=[stop], vllm_xargs=FILL_ALL)
    assert choice["token_ids"] == full[: full.index(stop) + 1] and choice["finish_reason"] == "stop"
    # 13 tokens: the second window of 8 is cut in the middle.
    choice = completion(url, max_tokens=13, ignore_eos=True, vllm_xargs=FILL_ALL)
    assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 13, tau=1e9)
    assert len(choice["token_ids"]) == 13 and choice["finish_reason"] == "length"


def test_stop_string(setup):
    url, *_ = setup
    full = completion(url, max_tokens=24, ignore_eos=True, vllm_xargs=FILL_ALL)["text"]
    stop = next(full[i:i + 3] for i in range(6, len(full) - 3) if full[i:i + 3].isascii() and full[i:i + 3].strip())
    choice = completion(url, max_tokens=24, ignore_eos=True, stop=[stop], vllm_xargs=FILL_ALL)
    assert choice["text"] == full[: full.index(stop)] and choice["finish_reason"] == "stop"


def test_streaming_emits_committed_runs(setup):
    url, *_ = setup
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 24, "ignore_eos": True, "return_token_ids": True,
            "vllm_xargs": FILL_ALL}
    whole = post(url, "/v1/completions", body).json()["choices"][0]
    events = sse_events(post(url, "/v1/completions", {**body, "stream": True}, stream=True))
    chunks = [e["choices"][0] for e in events if e["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    runs = [len(c.get("token_ids") or []) for c in chunks]
    assert sum(runs) == 24 and max(runs) == WINDOW  # a whole window arrives in one event


def test_plain_tokens_come_with_the_log_probs_of_their_filling_rows(setup):
    """``logprobs`` of a plain WeDLM completion, whole and streamed: each token's is the reference
    decoder's (the mask row that filled its slot), its top entries beside it."""
    url, reference, *_ = setup
    choice = completion(url, max_tokens=20, ignore_eos=True, logprobs=2)
    expected = reference.generate(choice["prompt_token_ids"], StopRule(max_tokens=20), WeDLMParams(0.4, 0.02))
    assert choice["token_ids"] == expected.token_ids
    logprobs = choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 20
    assert max(abs(a - b) for a, b in zip(logprobs["token_logprobs"], expected.logprobs, strict=True)) < 1e-4
    assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"])
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 20, "ignore_eos": True, "logprobs": 2, "stream": True}
    events = sse_events(post(url, "/v1/completions", body, stream=True))
    streamed = [value for e in events if e["choices"] for value in (e["choices"][0].get("logprobs") or {})
                .get("token_logprobs", [])]
    assert streamed == logprobs["token_logprobs"]


def test_chat_stream(setup):
    url, *_ = setup
    body = {"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 16,
            "ignore_eos": True}
    whole = post(url, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    events = sse_events(post(url, "/v1/chat/completions", {**body, "stream": True}, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == whole


def test_a_request_may_pin_the_servers_own_w(setup):
    """On a server of a fixed W, ``wedlm_window_size`` equal to it is accepted and changes nothing."""
    url, *_ = setup
    pinned = completion(url, max_tokens=20, ignore_eos=True, vllm_xargs={**FILL_ALL, "wedlm_window_size": WINDOW})
    assert pinned["token_ids"] == completion(url, max_tokens=20, ignore_eos=True, vllm_xargs=FILL_ALL)["token_ids"]


@pytest.mark.parametrize("body,message", [
    ({"vllm_xargs": {"wedlm_entropy_threshold": -1}}, "entropy_threshold must be a positive"),
    ({"vllm_xargs": {"wedlm_pos_penalty": -2}}, "pos_penalty must be a finite number"),
    ({"vllm_xargs": {"wedlm_lossless": "yes"}}, "wedlm_lossless must be true or false"),
    ({"vllm_xargs": {"wedlm_lossless": 2}}, "wedlm_lossless must be true or false"),
    # Misspelt knobs: an error naming the accepted keys, not a silent default.
    ({"vllm_xargs": {"wedlm_window": 4}},
     "unknown WeDLM key\\(s\\) 'wedlm_window'; per request WeDLM accepts 'wedlm_decoding', "
     "'wedlm_entropy_threshold', 'wedlm_lossless', 'wedlm_pos_penalty'"),
    ({"vllm_xargs": {"wedlm_entropy_treshold": 0.5}}, "unknown WeDLM key\\(s\\) 'wedlm_entropy_treshold'"),
    # A pinned W this server (a fixed W 8) does not run; the check is the front end's.
    ({"vllm_xargs": {"wedlm_window_size": 4}}, "wedlm_window_size 4: this server runs every request at a fixed W of 8"),
    ({"vllm_xargs": {"wedlm_window_size": "8"}}, "wedlm_window_size must be an integer"),
    ({"prompt": "1, 2, 3, " * 400}, "maximum context length|max_model_len|too long|longer than"),
])
def test_bad_requests_get_a_400_and_the_server_keeps_serving(setup, body, message):
    import re

    url, *_ = setup
    model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    response = requests.post(f"{url}/v1/completions", timeout=120,
                             json={"model": model, "prompt": PROMPT, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    assert re.search(message, response.text), response.text
    assert len(completion(url, max_tokens=4, ignore_eos=True)["token_ids"]) == 4


def test_aborted_streams_do_not_disturb_others(setup):
    url, reference, *_ = setup
    model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    results: dict[int, dict] = {}

    def good(i):
        results[i] = completion(url, prompt=f"{i}, {i + 1}, {i + 2}", max_tokens=20, ignore_eos=True)

    def aborted():
        body = {"model": model, "prompt": PROMPT, "max_tokens": 120, "ignore_eos": True, "stream": True}
        with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=120) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n == 3:
                    break  # the client goes away mid-stream

    threads = [threading.Thread(target=aborted) for _ in range(3)] + [threading.Thread(target=good, args=(i,))
                                                                      for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(results) == [0, 1, 2, 3]
    for choice in results.values():
        assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 20)


def test_tokens_per_forward_is_logged(setup):
    import re
    import time

    url, *_, log = setup
    pattern = re.compile(r"WeDLM decoding: ([0-9.]+) tokens per forward")
    for _ in range(3):  # the line comes at most every 5 s, while requests decode
        completion(url, max_tokens=48, ignore_eos=True, vllm_xargs=FILL_ALL)
        found = pattern.findall(log.read_text())
        if found:
            break
        time.sleep(5.5)
    assert found, "no tokens-per-forward line in the server log"
    assert max(float(x) for x in found) > 1.0


DIFFUSION = "vllm:diffusion_num_"  # vLLM's diffusion-decoding counters, filled by WeDLM engines


def counted(url: str, before: dict, committed: int, deadline: float) -> dict[str, float]:
    """The diffusion counters' totals since ``before``, once ``committed`` tokens are counted (the
    frontend records a step's stats right after handing out its outputs) or ``deadline`` passed."""
    import time

    while True:
        delta = {k: v - before.get(k, 0.0) for k, v in prometheus_counters(url, DIFFUSION).items()}
        if delta.get(f"{DIFFUSION}committed_tokens_total", 0) >= committed or time.monotonic() > deadline:
            return {name: value for name, value in delta.items() if name.endswith("_total")}
        time.sleep(0.2)


def test_tokens_per_forward_is_in_prometheus_metrics(setup):
    import time

    url, *_, log = setup
    before = prometheus_counters(url, DIFFUSION)
    # Fill-all windows of 8, 24 tokens: a window's tokens fill in one forward, are returned then
    # (every slot before them is decided), and have their KV written in the next forward: 8 masks,
    # then 8 filled + 8 masks twice (the window keeps its 8 masks, as in WeDLM's engine), and the
    # last 8 need no forward of their own: 3 request-forwards of 8 + 16 + 16 slots.
    completion(url, max_tokens=24, ignore_eos=True, vllm_xargs=FILL_ALL)
    deadline = time.monotonic() + 30
    assert counted(url, before, 24, deadline) == {f"{DIFFUSION}denoising_steps_total": 3.0,
                                                  f"{DIFFUSION}canvas_positions_total": 40.0,
                                                  f"{DIFFUSION}committed_tokens_total": 24.0}
    # 20 tokens: the same three windows of 8 commit 24, and the last one's 4 past max_tokens are not
    # returned; the committed counter counts the 20 the request got.
    before = prometheus_counters(url, DIFFUSION)
    assert len(completion(url, max_tokens=20, ignore_eos=True, vllm_xargs=FILL_ALL)["token_ids"]) == 20
    assert counted(url, before, 20, deadline + 30) == {f"{DIFFUSION}denoising_steps_total": 3.0,
                                                       f"{DIFFUSION}canvas_positions_total": 40.0,
                                                       f"{DIFFUSION}committed_tokens_total": 20.0}
    # vLLM's own stats line (every second here) would call these counts draft acceptance; the
    # WeDLM line replaces it. Wait until vLLM has logged the interval that saw the decoding.
    while "Avg generation throughput" not in log.read_text() and time.monotonic() < deadline + 30:
        time.sleep(0.5)
    text = log.read_text()
    assert "Avg generation throughput" in text
    assert "SpecDecoding metrics" not in text


def test_knobs_of_others_in_vllm_xargs_are_left_alone(setup):
    url, reference, *_ = setup
    choice = completion(url, max_tokens=12, ignore_eos=True, vllm_xargs={**FILL_ALL, "someone_elses_knob": 1})
    assert choice["token_ids"] == expect(reference, choice["prompt_token_ids"], 12, tau=1e9)


def test_metrics_are_vllms_own_plus_the_diffusion_counters(setup):
    url, *_ = setup
    stock = stock_vllm_families(["--model", model_name(url), "--seed", "0", *serve_args(), *ARGS])
    served = served_families(url, "vllm:")
    assert stock <= served
    counters = ("denoising_steps", "canvas_positions", "committed_tokens")  # as exposed: x_total, x_created
    assert served - stock == ({(f"{DIFFUSION}{name}_total", "counter") for name in counters}
                              | {(f"{DIFFUSION}{name}_created", "gauge") for name in counters})


def test_vllm_bench_serve_reads_the_diffusion_counters(setup, tmp_path):
    """vLLM's own benchmark client runs against a WeDLM server and reports its Diffusion Decoding
    section from the counters: 8 fill-all requests of 24 tokens at W 8 commit 192 tokens in
    8 x 3 request-forwards over 8 x (8 + 16 + 16) window slots. vLLM derives "committed per
    denoising step" with its block-diffusion formula (a fixed canvas and one extra commit step per
    canvas), which WeDLM's sliding window does not have, so that one figure is not tokens per
    forward; the raw counters are, and /metrics gives it exactly (README, Troubleshooting)."""
    import subprocess
    import sys

    url, _, _, _ = setup
    before = prometheus_counters(url, "vllm:diffusion")
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--base-url", url,
               "--model", model_name(url), "--dataset-name", "random", "--random-input-len", "16",
               "--random-output-len", "24", "--num-prompts", "8", "--ignore-eos", "--temperature", "0",
               "--extra-body", json.dumps({"vllm_xargs": FILL_ALL}), "--save-result",
               "--result-dir", str(tmp_path), "--result-filename", "bench.json"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Diffusion Decoding" in run.stdout
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 8 and result["total_output_tokens"] == 8 * 24
    assert result["diffusion_committed_tokens"] == 8 * 24
    assert result["diffusion_canvas_positions"] == 8 * (8 + 16 + 16)
    after = prometheus_counters(url, "vllm:diffusion")
    # The counters also moved by bench's single warm-up request (its own length), so compare
    # tokens per forward of everything since `before`: all fill-all requests of 24 tokens.
    steps = after["vllm:diffusion_num_denoising_steps_total"] - before["vllm:diffusion_num_denoising_steps_total"]
    tokens = after["vllm:diffusion_num_committed_tokens_total"] - before["vllm:diffusion_num_committed_tokens_total"]
    assert tokens / steps == 24 / 3
