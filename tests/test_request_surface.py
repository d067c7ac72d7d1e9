"""What AR requests ask of vLLM, in WeDLM mode: logit_bias, allowed_token_ids, min_tokens, penalties,
bad_words, min_p, prompt_logprobs.

Each logits row a window forwards gets its request's allowed tokens, bias, bad words and penalties
(the last two over the tokens it sees: core/row_context.py), so greedy lossless WeDLM and per-request AR must equal an
``--decoding ar`` engine (vLLM's own sampler) token for token with the same edits; plain WeDLM must
keep every token inside them. ``min_p`` 1 keeps only the
likeliest token, so a sampled request with it must give the greedy tokens, in vLLM's AR engine and
in every WeDLM mode. Requests without edits in the same batch must not change. Prompt log-probs
come from the prefill, which WeDLM mode shares with AR: every mode must return the AR engine's
(to the AR engine's own spread between batch layouts, 0 on a batch-invariant CPU: tests/batch_spread.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from batch_spread import assert_match, largest_spread
from conftest import build_checkpoint
from engines import running_llm
from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.core.logit_edits import LogitEdits, edit_logits
from vllm_wedlm.core.sampling import SamplingBatch, SamplingSpec, sample, sample_request

WINDOW = 8
MAX_TOKENS = 32
PROMPTS = ["1, 2, 3, 4", "The quiet river reads the number and the lamp", "Gus",
           "<|im_start|>user\nAda has 12 apples.<|im_end|>\n<|im_start|>assistant\n"]
CASES = [("qwen3", False), ("qwen2", False), ("qwen3", True)]  # (variant, fixed window rows)


def test_edits_apply_to_their_rows_only():
    logits = torch.randn(5, 40, dtype=torch.bfloat16)
    allowed = LogitEdits.of([3, 7, 11], {7: 2.5})
    biased = LogitEdits.of(None, {0: -100.0, 39: 1.0})
    edited = edit_logits(logits, [allowed, None, biased, allowed, None])
    assert edited.dtype == torch.float32
    plain = logits.float()
    for row in (0, 3):
        expected = torch.full((40,), float("-inf"))
        expected[[3, 7, 11]] = plain[row, [3, 7, 11]]
        expected[7] += 2.5
        assert torch.equal(edited[row], expected)
    assert torch.equal(edited[[1, 4]], plain[[1, 4]])
    expected = plain[2].clone()
    expected[0] -= 100.0
    expected[39] += 1.0
    assert torch.equal(edited[2], expected)
    assert LogitEdits.of(None, None) is None and LogitEdits.of([], {}) is None


def test_min_tokens_holds_the_stop_tokens_back_by_output_index():
    logits = torch.randn(4, 12)
    held = LogitEdits.of(None, None, min_tokens=2, stop_ids={5, 9})
    assert held.stop_ids == (5, 9) and LogitEdits.of(None, None, min_tokens=2, stop_ids=()) is None
    edited = edit_logits(logits, [held, held, held, None], output_index=torch.tensor([0, 1, 2, 0]))
    assert torch.isinf(edited[:2, [5, 9]]).all() and torch.equal(edited[2:], logits[2:])
    assert torch.equal(edited[:2, [0, 1, 2, 3, 4, 6, 7, 8, 10, 11]], logits[:2, [0, 1, 2, 3, 4, 6, 7, 8, 10, 11]])
    with pytest.raises(ValueError, match="output index"):
        edit_logits(logits, [held] * 4)


def test_min_p_keeps_only_tokens_near_the_likeliest():
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    spec = SamplingSpec(temperature=1.0, min_p=0.3)
    batch = SamplingBatch.of([spec], [64])
    draws = torch.stack([sample(logits, batch, mask_id=49) for _ in range(20)])  # [20, 64]
    banned = logits.clone()
    banned[:, 49] = float("-inf")
    kept = torch.softmax(banned, dim=-1)
    chosen = kept.gather(1, draws.T)  # [64, 20]
    assert (chosen >= 0.3 * kept.amax(dim=-1, keepdim=True)).all()
    assert sum(len(set(column.tolist())) > 1 for column in draws.T) > 8  # rows still draw more than one token
    # min_p 1: only the likeliest token survives, whatever the temperature.
    one = SamplingBatch.of([SamplingSpec(temperature=2.0, min_p=1.0)], [64])
    assert torch.equal(sample(logits, one, mask_id=49), banned.argmax(dim=-1))
    assert torch.equal(sample_request(logits, SamplingSpec(temperature=2.0, min_p=1.0), mask_id=49),
                       banned.argmax(dim=-1))


def params(mode: str, edits: dict | None = None, **kwargs):
    from vllm import SamplingParams

    extra = {"wedlm_lossless": True} if mode == "lossless" else {"wedlm_decoding": "ar"} if mode == "ar" else None
    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "extra_args": extra,
                             **(edits or {}), **kwargs})


def token_ids(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


def token_logprobs(outputs) -> list[tuple[list[int], list[list[tuple[int, int, float]]]]]:
    """Per prompt: its tokens, and per token (token id, rank, log-prob) of each returned entry."""
    return [(list(out.outputs[0].token_ids),
             [sorted((token, entry.rank, entry.logprob) for token, entry in position.items())
              for position in out.outputs[0].logprobs]) for out in outputs]


def prompt_logprobs(outputs) -> list[list[list[tuple[int, int, float]]]]:
    """Per prompt, per position after the first: (token id, rank, log-prob) of each returned entry."""
    return [[sorted((token, entry.rank, entry.logprob) for token, entry in position.items())
             for position in out.prompt_logprobs[1:]] for out in outputs]


MIN_TOKENS = 20
LOGPROBS = 3
CHOSEN = [5, 1, 17]  # logprob_token_ids: the log-probs of these ids at every position, in this order
PENALTIES = {"repetition_penalty": 1.3, "presence_penalty": 0.8, "frequency_penalty": 0.6}
EDITED = ("bias", "allowed", "min_tokens", "penalties", "bad_words")  # and, on the AR engine alone, "stop_only"


def edit_sets(baseline: list[list[int]], tokenizer) -> dict[str, list[dict]]:
    """Per prompt, edits that must change the greedy text: ban AR's most frequent token and favour a
    rare one; allow only AR's tokens but its two most frequent, and a block of others; make AR's
    third token a stop token that ``min_tokens`` holds back; penalise repeats (all three penalties);
    make bad words of AR's most frequent token and of two tokens of its first text."""
    vocab = len(tokenizer)  # vLLM checks allowed ids against the tokenizer (the model's may be padded)
    counts = Counter(token for ids in baseline for token in ids)
    (top, _), (second, _) = counts.most_common(2)
    rare = next(t for t in range(vocab - 1, 0, -1) if t not in counts)
    allowed = sorted(({t for t in counts if t < vocab} | set(range(100, 160))) - {top, second})
    return {"bias": [{"logit_bias": {top: -100.0, rare: 3.0}}] * len(baseline),
            "allowed": [{"allowed_token_ids": allowed}] * len(baseline),
            "min_tokens": [{"min_tokens": MIN_TOKENS, "stop_token_ids": [ids[2]]} for ids in baseline],
            "stop_only": [{"stop_token_ids": [ids[2]]} for ids in baseline],
            "penalties": [PENALTIES] * len(baseline),
            "bad_words": [{"bad_words": [tokenizer.decode([top]), tokenizer.decode(baseline[0][4:6])]}] * len(baseline)}


def bad_word_ids(words: list[str], tokenizer) -> list[list[int]]:
    """The token ids vLLM bans for ``words`` (each with and without a leading space)."""
    from vllm import SamplingParams

    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tokenizer)
    return params.bad_words_token_ids


def ar_layouts(llm, ask, read) -> list:
    """The AR engine's results (``read`` of its outputs, per prompt) for PROMPTS asked with ``ask``,
    in several batch layouts: all together, one at a time, and each prompt three times over, as the
    WeDLM runs below batch them (each copy a layout of its own)."""
    together = read(llm.generate(PROMPTS, ask, use_tqdm=False))
    alone = [read(llm.generate([prompt], ask, use_tqdm=False))[0] for prompt in PROMPTS]
    tripled = read(llm.generate([prompt for prompt in PROMPTS for _ in range(3)], ask, use_tqdm=False))
    return [together, alone, *(tripled[copy::3] for copy in range(3))]


@pytest.fixture(scope="module", params=CASES, ids=[f"{v}{'-fixed-rows' if f else ''}" for v, f in CASES])
def runs(request, tmp_path_factory):
    variant, fixed_rows = request.param
    path = build_checkpoint(tmp_path_factory.mktemp("edits"), TinySpec(variant=variant, logit_scale=30.0))
    runs: dict = {}
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar:
        runs["engine_greedy"] = token_ids(ar.generate(PROMPTS, params("plain"), use_tqdm=False))
        tokenizer = ar.get_tokenizer()
        edits = edit_sets(runs["engine_greedy"], tokenizer)
        runs["bad_word_ids"] = bad_word_ids(edits["bad_words"][0]["bad_words"], tokenizer)
        runs["edits"] = edits
        for name in (*EDITED, "stop_only"):
            runs[f"engine_{name}"] = token_ids(ar.generate(PROMPTS, [params("plain", knobs) for knobs in edits[name]],
                                                           use_tqdm=False))
        runs["engine_min_p"] = token_ids(ar.generate(PROMPTS, params("plain", temperature=1.0, min_p=1.0, seed=3),
                                                     use_tqdm=False))
        # Log-probs, and how far AR's own move between batch layouts on this CPU (tests/batch_spread.py).
        spreads = []
        for name, ask, read in (("prompt_logprobs", params("plain", prompt_logprobs=5), prompt_logprobs),
                                ("logprobs", params("plain", logprobs=LOGPROBS), token_logprobs),
                                ("chosen", params("plain", logprob_token_ids=CHOSEN), token_logprobs)):
            layouts = ar_layouts(ar, ask, read)
            runs[f"engine_{name}"] = layouts[0]
            spreads.append(largest_spread(layouts))
        runs["ar_spread"] = max(spreads)
    config = {"decoding": "wedlm", "window_size": WINDOW, "fixed_window_rows": fixed_rows}
    with running_llm(path, dtype="float32", additional_config=config) as llm:
        runs["plain_greedy"] = token_ids(llm.generate(PROMPTS, params("plain"), use_tqdm=False))
        for name in EDITED:
            # Every mode with the edits, and plain requests without them, in one batch.
            modes = ["lossless", "ar", "plain", "unedited"]
            batch = [params(m, None if m == "unedited" else knobs) for knobs in edits[name] for m in modes]
            outputs = token_ids(llm.generate([p for p in PROMPTS for _ in modes], batch, use_tqdm=False))
            for i, mode in enumerate(modes):
                runs[f"{mode}_{name}"] = outputs[i::len(modes)]
        modes = ["lossless", "ar", "plain"]
        outputs = llm.generate([p for p in PROMPTS for _ in modes],
                               [params(m, prompt_logprobs=5) for _ in PROMPTS for m in modes], use_tqdm=False)
        for i, mode in enumerate(modes):
            runs[f"{mode}_prompt_logprobs"] = prompt_logprobs(outputs[i::len(modes)])
            runs[f"{mode}_with_prompt_logprobs"] = token_ids(outputs[i::len(modes)])
        for mode in ("lossless", "ar", "plain"):
            runs[f"{mode}_min_p"] = token_ids(llm.generate(
                PROMPTS, params(mode, temperature=1.0, min_p=1.0, seed=3), use_tqdm=False))
        # Log-probs of every mode's requests in one batch (plain ones: test_plain_logprobs.py).
        modes = ["lossless", "ar", "plain"]
        outputs = llm.generate([p for p in PROMPTS for _ in modes],
                               [params(m, logprobs=LOGPROBS) for _ in PROMPTS for m in modes], use_tqdm=False)
        for i, mode in enumerate(modes):
            runs[f"{mode}_logprobs"] = token_logprobs(outputs[i::len(modes)])
        # Chosen ids' log-probs in every mode, beside plain requests asking the top K, in one batch.
        modes = ["lossless", "ar", "plain", "top"]
        asks = {"top": params("plain", logprobs=LOGPROBS)}
        outputs = llm.generate([p for p in PROMPTS for _ in modes],
                               [asks.get(m) or params(m, logprob_token_ids=CHOSEN) for _ in PROMPTS for m in modes],
                               use_tqdm=False)
        for i, mode in enumerate(modes):
            runs[f"{mode}_chosen"] = token_logprobs(outputs[i::len(modes)])
    return runs


@pytest.mark.parametrize("name", EDITED)
def test_lossless_and_per_request_ar_equal_the_ar_engine_with_the_same_edits(runs, name):
    assert runs[f"engine_{name}"] != runs["engine_greedy"]  # the edits change AR's text
    if name == "min_tokens":  # which without min_tokens would stop by the third token
        assert all(len(ids) <= 3 for ids in runs["engine_stop_only"])
        assert all(MIN_TOKENS <= len(ids) for ids in runs["engine_min_tokens"])
    assert runs[f"lossless_{name}"] == runs[f"engine_{name}"]
    assert runs[f"ar_{name}"] == runs[f"engine_{name}"]


def test_plain_wedlm_keeps_every_token_inside_the_edits(runs):
    banned = next(token for token, bias in runs["edits"]["bias"][0]["logit_bias"].items() if bias < 0)
    assert all(banned not in ids for ids in runs["plain_bias"])
    assert runs["plain_bias"] != runs["plain_greedy"]
    allowed = set(runs["edits"]["allowed"][0]["allowed_token_ids"])
    assert all(set(ids) <= allowed for ids in runs["plain_allowed"])
    assert all(len(ids) == MAX_TOKENS for ids in runs["plain_allowed"] + runs["plain_bias"])
    # A bad word of one token never comes out; a longer one can (its tokens may be filled right to left).
    single = [word[0] for word in runs["bad_word_ids"] if len(word) == 1]
    assert single and all(not set(single) & set(ids) for ids in runs["plain_bad_words"])
    assert any(len(word) > 1 for word in runs["bad_word_ids"])
    # Penalties change plain WeDLM's text too (its rows see the committed output and the fills).
    assert runs["plain_penalties"] != runs["plain_greedy"]
    # min_tokens: no stop token before it, so no request ends before it.
    for ids, knobs in zip(runs["plain_min_tokens"], runs["edits"]["min_tokens"], strict=True):
        assert len(ids) >= MIN_TOKENS and knobs["stop_token_ids"][0] not in ids[:MIN_TOKENS]


@pytest.mark.parametrize("name", EDITED)
def test_requests_without_edits_do_not_change_beside_edited_ones(runs, name):
    assert runs[f"unedited_{name}"] == runs["plain_greedy"]


def test_min_p_one_samples_the_greedy_tokens_in_every_mode(runs):
    assert runs["engine_min_p"] == runs["engine_greedy"]  # vLLM's own meaning of min_p
    assert runs["lossless_min_p"] == runs["engine_greedy"]
    assert runs["ar_min_p"] == runs["engine_greedy"]
    assert runs["plain_min_p"] == runs["plain_greedy"]


def test_prompt_logprobs_equal_the_ar_engines_in_every_mode(runs):
    expected = runs["engine_prompt_logprobs"]
    assert [len(p) for p in expected] == [len(p) for p in runs["plain_prompt_logprobs"]] and expected[0]
    assert all(len(position) >= 5 for prompt in expected for position in prompt)
    for mode in ("lossless", "ar", "plain"):
        assert_match(runs[f"{mode}_prompt_logprobs"], expected, runs["ar_spread"], mode)
    # Asking for them changes no output.
    assert runs["lossless_with_prompt_logprobs"] == runs["engine_greedy"]
    assert runs["ar_with_prompt_logprobs"] == runs["engine_greedy"]
    assert runs["plain_with_prompt_logprobs"] == runs["plain_greedy"]


def test_a_checkpoint_default_repetition_penalty_applies_as_in_ar(tmp_path):
    """A generation_config.json with ``repetition_penalty`` (as Qwen2.5-7B-Instruct's) is every
    request's default in WeDLM mode as in AR: a default greedy request, lossless or per-request AR,
    gives the AR engine's tokens, which the penalty changes."""
    import json

    path = build_checkpoint(tmp_path, TinySpec(variant="qwen3", logit_scale=30.0))
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**generation, "repetition_penalty": 1.5}))

    def defaults(llm, mode: str):
        params = llm.get_default_sampling_params()
        assert params.repetition_penalty == 1.5
        params.max_tokens, params.temperature, params.ignore_eos = MAX_TOKENS, 0.0, True
        params.extra_args = {"wedlm_lossless": True} if mode == "lossless" else {"wedlm_decoding": "ar"}
        return params

    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar:
        expected = token_ids(ar.generate(PROMPTS, defaults(ar, "ar"), use_tqdm=False))
        unpenalised = token_ids(ar.generate(PROMPTS, params("plain"), use_tqdm=False))
    assert expected != unpenalised
    with running_llm(path, dtype="float32", additional_config={"decoding": "wedlm", "window_size": WINDOW}) as llm:
        for mode in ("lossless", "ar"):
            assert token_ids(llm.generate(PROMPTS, defaults(llm, mode), use_tqdm=False)) == expected, mode


def test_logprobs_of_lossless_and_per_request_ar_tokens_equal_the_ar_engines(runs):
    expected = runs["engine_logprobs"]
    assert [ids for ids, _ in expected] == runs["engine_greedy"]
    assert all(len(entries) == len(ids) and all(len(e) >= LOGPROBS for e in entries) for ids, entries in expected)
    assert_match(runs["lossless_logprobs"], expected, runs["ar_spread"], "lossless")
    assert_match(runs["ar_logprobs"], expected, runs["ar_spread"], "ar")
    plain = runs["plain_logprobs"]  # beside them, the plain tokens unchanged, each with its entries
    assert [ids for ids, _ in plain] == runs["plain_greedy"]
    assert all(len(entries) == len(ids) and all(len(e) >= LOGPROBS for e in entries) for ids, entries in plain)


def test_log_probs_of_chosen_token_ids_in_every_mode(runs):
    """vLLM's ``logprob_token_ids``: at every position the token's own entry and those of the chosen
    ids. Lossless and per-request AR: the AR engine's, exactly. Plain: its tokens, each with the
    entries of the mask row that filled it, the same row the top-K request beside it reads."""
    expected = runs["engine_chosen"]
    assert [ids for ids, _ in expected] == runs["engine_greedy"]
    assert all({token for token, _, _ in position} == {*CHOSEN, ids[k]}
               for ids, entries in expected for k, position in enumerate(entries))
    assert_match(runs["lossless_chosen"], expected, runs["ar_spread"], "lossless")
    assert_match(runs["ar_chosen"], expected, runs["ar_spread"], "ar")
    for (ids, chosen), (top_ids, top) in zip(runs["plain_chosen"], runs["top_chosen"], strict=True):
        assert ids == top_ids
        for k, (position, top_position) in enumerate(zip(chosen, top, strict=True)):
            assert {token for token, _, _ in position} == {*CHOSEN, ids[k]}
            own = [entry for entry in position if entry[0] == ids[k]]
            assert_match(own, [entry for entry in top_position if entry[0] == ids[k]], runs["ar_spread"])


def test_a_lossless_servers_requests_return_logprobs_by_default(tmp_path):
    """On an engine whose requests are lossless by default (``--wedlm-lossless``), a request that says
    nothing gets its log-probs, AR's; one that turns lossless off gets a plain request's tokens, each
    with its entries."""
    path = build_checkpoint(tmp_path, TinySpec(variant="qwen2", logit_scale=30.0))
    with running_llm(path, dtype="float32", additional_config={"decoding": "ar"}) as ar:
        expected = token_logprobs(ar.generate(PROMPTS, params("plain", logprobs=LOGPROBS), use_tqdm=False))
    config = {"decoding": "wedlm", "window_size": WINDOW, "lossless": True}
    with running_llm(path, dtype="float32", additional_config=config) as llm:
        assert token_logprobs(llm.generate(PROMPTS, params("plain", logprobs=LOGPROBS), use_tqdm=False)) == expected
        off = {"extra_args": {"wedlm_lossless": False}}
        plain = token_logprobs(llm.generate(PROMPTS, params("plain", off, logprobs=LOGPROBS), use_tqdm=False))
        assert [ids for ids, _ in plain] == token_ids(llm.generate(PROMPTS, params("plain", off), use_tqdm=False))
        assert all(len(entries) == len(ids) == MAX_TOKENS for ids, entries in plain)
