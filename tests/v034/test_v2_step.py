"""The V2 binding's first slice (vllm_wedlm/v2) stepped by vLLM 0.34's own objects (harness.py):
plain WeDLM, W 16, greedy, token for token what the reference decoder gives, for one request and
for a batch whose KV cache is too small for it (vLLM preempts and resumes requests)."""

from __future__ import annotations

import json

import pytest
from harness import StepHarness
from transformers import AutoTokenizer
from vllm.sampling_params import SamplingParams
from vllm.triton_utils import HAS_TRITON
from vllm.v1.core.sched.diffusion_scheduler import DiffusionScheduler
from vllm.v1.worker.gpu.model_states.interface import ModelState

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import held_out_tasks
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference.decoder import ReferenceDecoder, ReferenceOutput, StopRule
from vllm_wedlm.training.data.tasks import chat_prompt
from vllm_wedlm.v2.model_state import WeDLMModelState
from vllm_wedlm.v2.scheduler import WeDLMScheduler

W = 16
STOP = frozenset(json.loads((MICRO_CHECKPOINT / "generation_config.json").read_text())["eos_token_id"])
MASK_ID = json.loads((MICRO_CHECKPOINT / "config.json").read_text())["mask_token_id"]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Held-out arithmetic and counting chats (the micro model's kinds): arithmetic first."""
    tokenizer = AutoTokenizer.from_pretrained(str(MICRO_CHECKPOINT))
    tasks = held_out_tasks(3, ("arithmetic", "counting"), max_number=19)
    return [tokenizer(chat_prompt(tokenizer, t))["input_ids"] for kind in ("arithmetic", "counting")
            for t in tasks[kind]]


@pytest.fixture(scope="module")
def reference() -> ReferenceDecoder:
    return ReferenceDecoder(load_transformers_model(MICRO_CHECKPOINT), mask_token_id=MASK_ID, window_size=W)


def params(max_tokens: int, canvas: int | None = None) -> SamplingParams:
    extra = None if canvas is None else {"diffusion_canvas_length": canvas}  # vLLM's per-request canvas
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=sorted(STOP), extra_args=extra)


def assert_same_as_reference(harness: StepHarness, req_id: str, expected: ReferenceOutput) -> None:
    out = harness.finished[req_id]
    assert out.token_ids == expected.token_ids, req_id
    assert out.finish_reason == expected.finish_reason, req_id
    # Each window forward commits the run the previous one completed; the first commits none. The
    # reference returns a run before the forward that writes its KV (where a stop inside it ends
    # the request), V2 after it: one forward more, whose run holds the reference's last one.
    runs = harness.trace.runs[req_id]
    assert runs[0] == 0 and len(runs) == expected.num_forwards + 1, (runs, expected.runs)
    assert runs[1:-1] == expected.runs[:-1] and runs[-1] >= expected.runs[-1], (runs, expected.runs)


def test_the_binding_subclasses_vllm_and_is_not_a_diffusion_model():
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W)
    assert HAS_TRITON  # the V2 kernels run (Triton's interpreter), not a fallback
    assert isinstance(harness.state, ModelState) and type(harness.state) is WeDLMModelState
    assert isinstance(harness.scheduler, DiffusionScheduler) and type(harness.scheduler) is WeDLMScheduler
    assert not harness.config.model_config.is_diffusion  # no diffusion request checks
    assert harness.config.num_speculative_tokens == harness.scheduler.num_spec_tokens == 2 * W  # the canvas
    assert harness.scheduler.num_sampled_tokens_per_step == 0
    assert harness.state.num_new_sampled_tokens_per_step == 0


def test_one_request_matches_the_reference(prompts, reference):
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W)
    harness.add("0", prompts[0], params(64))
    harness.run()
    expected = reference.generate(prompts[0], StopRule(max_tokens=64, stop_token_ids=STOP))
    assert_same_as_reference(harness, "0", expected)
    assert max(harness.trace.runs["0"]) > 1  # a window committed several tokens at once
    assert harness.trace.preemptions == 0


def test_a_batch_through_preemptions_matches_the_reference(prompts, reference):
    """Six requests of three lengths, four at a time, on a KV cache of 12 blocks of 16 tokens: vLLM
    preempts running requests, frees their KV and later prefills their tokens again; each comes
    back to the window it had (its fills included), so nothing it outputs changes."""
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=12)
    max_tokens = [24, 64, 40, 64, 24, 40]
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        harness.add(str(i), prompt, params(n))
    harness.run()
    assert harness.trace.preemptions >= 4
    assert harness.state.table.num_resumed == harness.trace.preemptions  # each got its window back,
    assert harness.state.table.resumed_fills > 0  # fills included
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        expected = reference.generate(prompt, StopRule(max_tokens=n, stop_token_ids=STOP))
        assert_same_as_reference(harness, str(i), expected)


def test_canvases_of_several_widths_in_one_batch_each_match_the_reference_at_their_w(prompts):
    """vLLM's per-request ``diffusion_canvas_length`` beside the served canvas of 2 W 16: a request
    with a canvas of 2 W rows decodes at that W, in the same steps as W 16 ones, and gives what the
    reference decoder gives at that W. (A canvas of one row is a window of one slot.)"""
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4)
    widths = {"w1": 2, "w4": 8, "w16": None, "one-row": 1}
    for (req_id, canvas), prompt in zip(widths.items(), prompts, strict=False):
        harness.add(req_id, prompt, params(40, canvas))
    harness.run()
    model = load_transformers_model(MICRO_CHECKPOINT)
    for (req_id, canvas), prompt in zip(widths.items(), prompts, strict=False):
        window = W if canvas is None else max(1, canvas // 2)
        if canvas == 1:  # one row a forward: a fill, then its commit, one token each two forwards
            runs = harness.trace.runs[req_id]
            assert runs[0] == 0 and set(runs) == {0, 1} and sum(runs) == len(harness.finished[req_id].token_ids)
            continue
        decoder = ReferenceDecoder(model, mask_token_id=MASK_ID, window_size=window)
        expected = decoder.generate(prompt, StopRule(max_tokens=40, stop_token_ids=STOP))
        assert_same_as_reference(harness, req_id, expected)
    assert max(harness.trace.runs["w16"]) > max(harness.trace.runs["w4"]) >= max(harness.trace.runs["w1"]) == 1


def test_each_request_keeps_its_own_knobs_in_one_batch(prompts, reference):
    """A request's ``wedlm_entropy_threshold`` and ``wedlm_pos_penalty`` (read once when it is added,
    ``protocol.classify``) select its fills beside requests of other knobs: each gives what the
    reference decoder gives with its own."""
    from vllm_wedlm.config import WeDLMSettings

    knobs = {"default": {}, "fill-all": {"wedlm_entropy_threshold": 1e9},
             "one-a-step": {"wedlm_entropy_threshold": "none"}, "near-first": {"wedlm_pos_penalty": 1.0}}
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4)
    for (req_id, extra), prompt in zip(knobs.items(), prompts, strict=False):
        harness.add(req_id, prompt, SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=sorted(STOP),
                                                   extra_args=extra or None))
    harness.run()
    for (req_id, extra), prompt in zip(knobs.items(), prompts, strict=False):
        own = WeDLMSettings().request_params(extra)  # the knobs over the defaults, as a server reads them
        expected = reference.generate(prompt, StopRule(max_tokens=40, stop_token_ids=STOP), params=own)
        assert_same_as_reference(harness, req_id, expected)
    assert max(harness.trace.runs["one-a-step"]) == 1 < max(harness.trace.runs["fill-all"])


def greedy_ar(model, prompt: list[int], max_tokens: int) -> list[int]:
    """What AR decoding gives (greedy, the whole sequence each step), to the first stop token."""
    import torch

    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax())
            tokens.append(token)
            if token in STOP:
                break
    return tokens[len(prompt):]


def kind(name: str, max_tokens: int) -> SamplingParams:
    extra = {"plain": None, "lossless": {"wedlm_lossless": True}, "ar": {"wedlm_decoding": "ar"}}[name]
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=sorted(STOP), extra_args=extra)


@pytest.mark.parametrize("num_blocks", [256, 12], ids=["roomy", "preempting"])
def test_lossless_and_per_request_ar_requests_give_ar_tokens_beside_plain_ones(prompts, reference, num_blocks):
    """A lossless request (its fills verified against its AR rows) and a per-request AR one (a lossless
    window of one row) give exactly AR's tokens, in one batch with plain requests, which still give
    the reference's; with a KV cache too small for the batch too (vLLM preempts and resumes them).
    Each keeps its next token unforwarded: its prefill stops one token short, and the prompt's last
    row draws the first output token in the first canvas."""
    from vllm_wedlm.core import WeDLMParams

    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=num_blocks)
    requests = {"plain-0": ("plain", 40), "lossless-1": ("lossless", 64), "ar-2": ("ar", 24),
                "lossless-3": ("lossless", 40), "ar-4": ("ar", 40), "plain-5": ("plain", 64)}
    for (req_id, (name, n)), prompt in zip(requests.items(), prompts, strict=True):
        harness.add(req_id, prompt, kind(name, n))
    harness.run()
    if num_blocks == 12:
        assert harness.trace.preemptions >= 2
        assert harness.state.table.num_resumed == harness.trace.preemptions  # each back to its window
    model = load_transformers_model(MICRO_CHECKPOINT)
    for (req_id, (name, n)), prompt in zip(requests.items(), prompts, strict=True):
        stop = StopRule(max_tokens=n, stop_token_ids=STOP)
        if name == "plain":
            assert_same_as_reference(harness, req_id, reference.generate(prompt, stop))
            continue
        expected = greedy_ar(model, prompt, n)
        assert harness.finished[req_id].token_ids == expected, req_id
        runs = harness.trace.runs[req_id]
        if name == "ar":  # one token a forward, the first from the prompt's last row
            assert set(runs) == {1} and len(runs) == len(expected), runs
        else:  # several tokens a forward where the fills pass, as the reference's lossless runs
            lossless = reference.generate(prompt, stop, params=WeDLMParams(lossless=True))
            assert lossless.token_ids == expected
            # (the last run may pass the stop, which ends the request there)
            assert max(runs) > 1 and sum(runs[:-1]) < len(expected) <= sum(runs), runs


def test_a_prompt_of_one_token_starts_with_its_canvas(prompts):
    """A lossless or per-request AR request whose prompt is one token has nothing to prefill before
    its unforwarded token: its first step is a canvas of that token's row, which draws AR's first
    token."""
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4)
    prompt = prompts[0][:1]
    harness.add("lossless", prompt, kind("lossless", 16))
    harness.add("ar", prompt, kind("ar", 16))
    harness.run()
    expected = greedy_ar(load_transformers_model(MICRO_CHECKPOINT), prompt, 16)
    assert harness.finished["lossless"].token_ids == harness.finished["ar"].token_ids == expected
    assert harness.trace.runs["ar"][0] == 1  # its first forward drew a token


def ar_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Each token's log-prob under AR decoding: its row's log-softmax (float32), after the tokens before it."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    rows = logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)].log_softmax(-1)
    return rows.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("num_blocks", [256, 12], ids=["roomy", "preempting"])
def test_each_token_carries_the_log_prob_of_the_row_that_drew_it(prompts, reference, num_blocks):
    """``logprobs`` on V2, by the log-prob stage both bindings share (``adapter/token_logprobs.py``): a
    plain token's entry is the mask row's that filled its slot (possibly forwards before it is
    reported), as the reference decoder records it; a lossless or per-request AR token's is the AR
    row's that drew it, as AR decoding gives it. Beside a request that asks for none; through
    preemptions too."""
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=num_blocks)
    requests = {"plain-0": ("plain", 40), "lossless-1": ("lossless", 40), "ar-2": ("ar", 24),
                "none-3": ("plain", 40), "plain-4": ("plain", 64), "lossless-5": ("lossless", 64)}
    for (req_id, (name, n)), prompt in zip(requests.items(), prompts, strict=True):
        params = kind(name, n)
        if not req_id.startswith("none"):
            params.logprobs = 3
        harness.add(req_id, prompt, params)
    harness.run()
    if num_blocks == 12:
        assert harness.trace.preemptions >= 2
    model = load_transformers_model(MICRO_CHECKPOINT)
    assert "none-3" not in harness.logprobs
    for (req_id, (name, n)), prompt in zip(requests.items(), prompts, strict=True):
        if req_id.startswith("none"):
            continue
        tokens = harness.finished[req_id].token_ids
        entries = harness.logprobs[req_id]
        assert [ids[0] for ids, _ in entries] == tokens  # each entry is its token's
        # The token, then the likeliest (vLLM's front end keeps the 3 asked for).
        assert all(len(ids) >= 4 and values[1] >= values[2] >= values[3] >= max(values[4:], default=-1e9)
                   for ids, values in entries)
        if name == "plain":
            expected = reference.generate(prompt, StopRule(max_tokens=n, stop_token_ids=STOP)).logprobs
        else:
            expected = ar_logprobs(model, prompt, tokens)
        assert max(abs(values[0] - e) for (_, values), e in zip(entries, expected, strict=True)) < 1e-4, req_id


def sampled(name: str, max_tokens: int, **settings) -> SamplingParams:
    params = kind(name, max_tokens)
    for key, value in settings.items():
        setattr(params, key, value)
    return params


def test_sampling_settings_reach_each_row(prompts, reference):
    """Each request's own temperature, top-k, top-p and min-p (vLLM's per-request sampling state)
    shape its rows' draws: top-k 1 and min-p 1 keep only the likeliest token, so those requests give
    the greedy tokens (plain: the reference decoder's; lossless and per-request AR: AR's) beside
    requests that sample at temperature 1."""
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=6)
    requests = {"plain-top-k": ("plain", {"temperature": 1.0, "top_k": 1}),
                "lossless-min-p": ("lossless", {"temperature": 0.8, "min_p": 1.0}),
                "ar-top-k": ("ar", {"temperature": 1.5, "top_k": 1, "top_p": 0.9}),
                "plain-hot": ("plain", {"temperature": 1.0}), "lossless-hot": ("lossless", {"temperature": 1.0}),
                "ar-hot": ("ar", {"temperature": 1.0, "seed": 3})}
    for (req_id, (name, settings)), prompt in zip(requests.items(), prompts, strict=True):
        harness.add(req_id, prompt, sampled(name, 32, **settings))
    harness.run()
    model = load_transformers_model(MICRO_CHECKPOINT)
    stop = StopRule(max_tokens=32, stop_token_ids=STOP)
    assert harness.finished["plain-top-k"].token_ids == reference.generate(prompts[0], stop).token_ids
    assert harness.finished["lossless-min-p"].token_ids == greedy_ar(model, prompts[1], 32)
    assert harness.finished["ar-top-k"].token_ids == greedy_ar(model, prompts[2], 32)
    hot = [harness.finished[r].token_ids for r in ("plain-hot", "lossless-hot", "ar-hot")]
    greedy = [reference.generate(prompts[3], stop).token_ids, greedy_ar(model, prompts[4], 32),
              greedy_ar(model, prompts[5], 32)]
    assert hot != greedy  # temperature 1 samples
    assert all(MASK_ID not in harness.finished[r].token_ids for r in requests)


def test_a_seeded_request_repeats_beside_others_and_through_preemptions(prompts):
    """A seeded request draws from its own stream (kept while it waits after a preemption, as its
    window is): alone, or among requests that preempt it, it gives the same tokens; another seed
    gives others."""
    def run(seed: int, crowded: bool) -> dict[str, list[int]]:
        harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=12 if crowded else 256)
        if crowded:  # first: vLLM preempts the requests that came last
            for i, prompt in enumerate(prompts[2:4]):
                harness.add(f"other-{i}", prompt, sampled("plain", 64, temperature=1.0))
        for name, prompt in (("plain", prompts[0]), ("lossless", prompts[1])):
            harness.add(name, prompt, sampled(name, 64, temperature=2.5, top_k=50, seed=seed))
        harness.run()
        if crowded:
            assert harness.trace.preemptions >= 2
        return {name: harness.finished[name].token_ids for name in ("plain", "lossless")}

    alone = run(7, crowded=False)
    assert run(7, crowded=True) == alone
    assert run(8, crowded=False) != alone


def edited_ar(model, prompt: list[int], max_tokens: int, edits) -> list[int]:
    """AR decoding (greedy) with a request's logit edits on each row (``core/logit_edits.py``)."""
    import torch

    from vllm_wedlm.core.logit_edits import edit_logits

    tokens = list(prompt)
    with torch.no_grad():
        for index in range(max_tokens):
            row = model(input_ids=torch.tensor([tokens])).logits[0, -1:]
            tokens.append(int(edit_logits(row, [edits], torch.tensor([index]))[0].argmax()))
            if tokens[-1] in STOP:
                break
    return tokens[len(prompt):]


def test_logit_edits_apply_to_every_row_of_their_request(prompts):
    """allowed_token_ids, logit_bias and min_tokens on V2, by ``core/logit_edits.py`` (the V1 binding's):
    a lossless and a per-request AR request give AR's tokens under the same edits, a plain one keeps
    every token inside them, beside a request without edits, which gives the reference's tokens."""
    from vllm_wedlm.core.logit_edits import LogitEdits

    model = load_transformers_model(MICRO_CHECKPOINT)
    prompt, max_tokens = prompts[0], 72
    greedy = greedy_ar(model, prompt, max_tokens)
    assert greedy[-1] in STOP and len(greedy) < max_tokens - 8  # the min_tokens case holds the stop back
    allowed = sorted((set(greedy) | STOP) - {greedy[1]})  # the greedy path is cut at its second token
    cases = {"allowed": {"allowed_token_ids": allowed}, "bias": {"logit_bias": {greedy[0]: -50.0, greedy[3]: 8.0}},
             "min-tokens": {"min_tokens": len(greedy) + 6}}
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=8)
    for case, settings in cases.items():
        for name in ("plain", "lossless", "ar"):
            harness.add(f"{name}-{case}", prompt, sampled(name, max_tokens, **settings))
    harness.add("unedited", prompt, kind("plain", max_tokens))
    harness.run()
    for case, settings in cases.items():
        params = sampled("plain", max_tokens, **settings)
        edits = LogitEdits.of(params.allowed_token_ids, params.logit_bias, params.min_tokens,
                              params.all_stop_token_ids)
        expected = edited_ar(model, prompt, max_tokens, edits)
        assert expected != greedy, case  # the edits change AR's tokens
        for name in ("lossless", "ar"):
            assert harness.finished[f"{name}-{case}"].token_ids == expected, (name, case)
        plain = harness.finished[f"plain-{case}"].token_ids
        if case == "allowed":
            assert set(plain) <= set(allowed)
        if case == "min-tokens":
            assert len(plain) >= len(greedy) + 6
    reference = ReferenceDecoder(model, mask_token_id=MASK_ID, window_size=W)
    assert harness.finished["unedited"].token_ids == reference.generate(
        prompt, StopRule(max_tokens=max_tokens, stop_token_ids=STOP)).token_ids


def context_edited_ar(model, prompt: list[int], max_tokens: int, params: SamplingParams) -> list[int]:
    """AR decoding (greedy) with a request's bad words and penalties as vLLM 0.34's AR sampler applies
    them: each bad word's last token banned where the output ends with the rest of it, then its own
    penalty kernel over the prompt's tokens and the output's counts."""
    import numpy as np
    import torch
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties

    vocab = model.config.vocab_size
    packed = np.zeros((vocab + 31) // 32, np.uint32)  # the prompt's tokens, a bit each (vLLM's layout)
    for token in prompt:
        packed[token // 32] |= np.uint32(1) << np.uint32(token % 32)
    prompt_mask = torch.from_numpy(packed.view(np.int32))[None].contiguous()
    settings = torch.tensor([[params.repetition_penalty], [params.frequency_penalty], [params.presence_penalty]],
                            dtype=torch.float32)
    zero = torch.zeros(1, dtype=torch.long)
    output: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            row = model(input_ids=torch.tensor([prompt + output])).logits[0, -1:].float().contiguous()
            for word in params.bad_words_token_ids or ():
                if len(output) >= len(word) - 1 and output[len(output) - len(word) + 1:] == list(word[:-1]):
                    row[0, word[-1]] = float("-inf")
            counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[None].to(torch.int32)
            apply_penalties(row, zero, zero, zero, settings[0].contiguous(), settings[1].contiguous(),
                            settings[2].contiguous(), prompt_mask, counts.contiguous())
            output.append(int(row[0].argmax()))
            if output[-1] in STOP:
                break
    return output


@pytest.mark.parametrize("num_blocks", [256, 12], ids=["roomy", "preempting"])
def test_penalties_and_bad_words_see_the_tokens_before_each_row(prompts, num_blocks):
    """Repetition, presence and frequency penalties and bad words on V2 (``v2/context_edits.py``): a
    lossless and a per-request AR request give vLLM 0.34's AR tokens under them (its penalty kernel
    over the tokens each row sees), also through preemptions; a plain request never gives a bad
    word of one token and its penalties change its tokens; a request without them beside gives the reference's."""
    model = load_transformers_model(MICRO_CHECKPOINT)
    prompt, max_tokens = prompts[3], 64
    greedy = greedy_ar(model, prompt, max_tokens)
    penalties = {"repetition_penalty": 1.3, "presence_penalty": 0.8, "frequency_penalty": 0.6}
    words = [[greedy[0]], [greedy[2], greedy[3]]]  # AR's first token, and the pair after its second
    # Token ids as a tokenizer makes them from ``bad_words`` (the harness has none).
    cases = {"penalties": penalties, "bad-words": {"_bad_words_token_ids": words},
             "both": {**penalties, "_bad_words_token_ids": words}}
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=num_blocks)
    for case, settings in cases.items():
        for name in ("plain", "lossless", "ar"):
            harness.add(f"{name}-{case}", prompt, sampled(name, max_tokens, **settings))
    harness.add("unedited", prompt, kind("plain", max_tokens))
    harness.run()
    if num_blocks == 12:
        assert harness.trace.preemptions >= 2
    for case, settings in cases.items():
        params = sampled("plain", max_tokens, **settings)
        expected = context_edited_ar(model, prompt, max_tokens, params)
        assert expected != greedy, case  # the edits change AR's tokens
        for name in ("lossless", "ar"):
            assert harness.finished[f"{name}-{case}"].token_ids == expected, (name, case)
        plain = harness.finished[f"plain-{case}"].token_ids
        if "_bad_words_token_ids" in settings:
            # (a word of two tokens may still end in a plain window where its first was a mask when
            # the row of its second filled, as on V1; the lossless and AR rows see it and ban it)
            assert greedy[0] not in plain
        else:
            assert plain != harness.finished["unedited"].token_ids
    reference = ReferenceDecoder(model, mask_token_id=MASK_ID, window_size=W)
    assert harness.finished["unedited"].token_ids == reference.generate(
        prompt, StopRule(max_tokens=max_tokens, stop_token_ids=STOP)).token_ids


def reasoning_markers(start: list[int], natural_end: list[int], forced_end: list[int]):
    """vLLM's reasoning config with its markers' token ids set (as ``initialize_token_ids`` sets them
    from a parser's strings)."""
    from vllm.config import ReasoningConfig

    config = ReasoningConfig()
    config._reasoning_start_token_ids, config._natural_reasoning_end_token_ids = start, natural_end
    config._reasoning_end_token_ids = forced_end
    return config


def budgeted_ar(model, prompt: list[int], max_tokens: int, budget: int, start: list[int], natural_end: list[int],
                forced_end: list[int]) -> list[int]:
    """Greedy AR decoding under a thinking budget, by vLLM's rule: once the tokens after the last start
    marker (with no natural end after it) reach the budget, the next token is the forced end's next
    marker token (after any prefix of it the sequence already ends with)."""
    import torch

    def last(seq: list[int], marker: list[int]) -> int:
        return max((i for i in range(len(seq) - len(marker) + 1) if seq[i:i + len(marker)] == marker), default=-1)

    seq = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            begin, end = last(seq, start), last(seq, natural_end)
            if begin >= 0 and begin > end and len(seq) - (begin + len(start)) >= budget:
                done = max((p for p in range(1, len(forced_end)) if seq[len(seq) - p:] == forced_end[:p]), default=0)
                seq.append(forced_end[done])
            else:
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] in STOP:
                break
    return seq[len(prompt):]


@pytest.mark.parametrize("num_blocks", [256, 12], ids=["roomy", "preempting"])
def test_a_thinking_budget_forces_the_end_of_reasoning(prompts, num_blocks):
    """A request with a thinking budget is decoded AR (a canvas of its one AR row), and vLLM 0.34's own
    budget state forces the end of its reasoning there: its tokens are AR's under the budget rule,
    through preemptions too, beside a request without a budget that gives the reference's. Markers:
    AR's second token starts reasoning; two tokens AR never gives end it (the second its natural end)."""
    model = load_transformers_model(MICRO_CHECKPOINT)
    prompt, max_tokens = prompts[0], 48
    greedy = greedy_ar(model, prompt, max_tokens)
    unused = [t for t in range(model.config.vocab_size) if t not in set(greedy) | set(prompt) | STOP and t != MASK_ID]
    start, forced_end = [greedy[1]], unused[:2]
    assert greedy[1] not in prompt and greedy[1] not in greedy[2:6]  # one start, early
    markers = reasoning_markers(start, forced_end[1:], forced_end)
    harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=num_blocks, reasoning=markers)
    budgets = (2, 5)
    for budget in budgets:
        harness.add(f"budget-{budget}", prompt, sampled("plain", max_tokens, thinking_token_budget=budget))
    harness.add("plain", prompts[1], kind("plain", max_tokens))
    harness.add("lossless", prompts[2], kind("lossless", max_tokens))
    harness.run()
    if num_blocks == 12:
        assert harness.trace.preemptions >= 1
    for budget in budgets:
        expected = budgeted_ar(model, prompt, max_tokens, budget, start, forced_end[1:], forced_end)
        assert expected[2 + budget: 4 + budget] == forced_end and expected != greedy
        assert harness.finished[f"budget-{budget}"].token_ids == expected, budget
        assert set(harness.trace.runs[f"budget-{budget}"]) == {1}  # one token a forward: decoded AR
    stop = StopRule(max_tokens=max_tokens, stop_token_ids=STOP)
    reference = ReferenceDecoder(model, mask_token_id=MASK_ID, window_size=W)
    assert harness.finished["plain"].token_ids == reference.generate(prompts[1], stop).token_ids
    assert harness.finished["lossless"].token_ids == greedy_ar(model, prompts[2], max_tokens)


def test_structured_outputs_keep_their_grammar_through_preemptions(prompts):
    """A plain and a lossless request under a grammar (a regular expression), with plain requests beside
    them, give the same tokens when a small KV cache preempts them as when it does not: each grammar
    matcher is kept with its window while its request waits, and the scheduler's matcher accepts
    every token reported. The text matches the expression."""
    import re

    from vllm.sampling_params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(MICRO_CHECKPOINT))
    regex = r"[a-e]{2} [0-9]{1,3} and [0-9]{1,3}\."  # unlike anything the model says unguided

    def run(num_blocks: int) -> dict[str, list[int]]:
        harness = StepHarness(MICRO_CHECKPOINT, window_size=W, max_num_seqs=4, num_blocks=num_blocks, tokenizer=True)
        for name in ("plain", "lossless"):
            structured = StructuredOutputsParams(regex=regex)
            structured._backend = "xgrammar"  # what vLLM's front end resolves
            harness.add(f"{name}-grammar", prompts[0], sampled(name, 40, structured_outputs=structured))
        for k, prompt in enumerate(prompts[1:4]):
            harness.add(f"free-{k}", prompt, kind("plain", 64))
        harness.run()
        if num_blocks == 12:
            assert {"plain-grammar", "lossless-grammar"} <= harness.trace.preempted, harness.trace.preempted
        assert all(out.finish_reason in ("stop", "length") for out in harness.finished.values())
        return {req_id: out.token_ids for req_id, out in harness.finished.items()}

    alone = run(256)
    assert run(12) == alone
    for name in ("plain", "lossless"):
        text = tokenizer.decode([t for t in alone[f"{name}-grammar"] if t not in STOP])
        assert re.fullmatch(regex, text), (name, text)
