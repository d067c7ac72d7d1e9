"""The V2 binding in vLLM 0.34's real engine on the CPU (cpu_engine.py): ``vllm.LLM`` serves the
micro model with WeDLM windows (W 16, greedy), token for token what the reference decoder gives, and
in fewer forwards than tokens."""

from __future__ import annotations

import json
import re

import cpu_engine
import pytest
from vllm import LLM, SamplingParams

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import held_out_tasks
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference.decoder import ReferenceDecoder, StopRule
from vllm_wedlm.training.data.tasks import chat_prompt
from vllm_wedlm.v2.model_state import WeDLMModelState
from vllm_wedlm.v2.request_validator import QUALNAME

W = 16
STOP = sorted(json.loads((MICRO_CHECKPOINT / "generation_config.json").read_text())["eos_token_id"])
MASK_ID = json.loads((MICRO_CHECKPOINT / "config.json").read_text())["mask_token_id"]
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def outputs(monkeypatch_module) -> dict[str, object]:
    cpu_engine.install()  # (the V2 binding: registered by the plugin's entry point, as vLLM loads plugins)
    forwards = []
    prepare = WeDLMModelState.prepare_inputs

    def counted(self, input_batch, req_states):
        result = prepare(self, input_batch, req_states)
        forwards.append(0 if self.step is None else len(self.step.slots))  # windows in the forward
        return result

    monkeypatch_module.setattr(WeDLMModelState, "prepare_inputs", counted)
    llm = LLM(model=str(MICRO_CHECKPOINT), max_model_len=512, max_num_seqs=4,
              diffusion_config={"canvas_length": 2 * W}, scheduler_cls="vllm_wedlm.v2.scheduler.WeDLMScheduler",
              logits_processors=[QUALNAME], **cpu_engine.ENGINE_ARGS)
    tokenizer = llm.get_tokenizer()
    tasks = held_out_tasks(4, ("arithmetic",), max_number=19)["arithmetic"]
    prompts = [chat_prompt(tokenizer, t) for t in tasks]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=STOP)
    results = llm.generate(prompts, params, use_tqdm=False)
    plain_forwards = list(forwards)
    # A lossless and a per-request AR request beside plain ones, in one batch.
    kinds = [{"wedlm_lossless": True}, {"wedlm_decoding": "ar"}, None, None]
    asks = [2, None, 2, None]  # log-probs: the lossless request and a plain one
    mixed = llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=STOP,
                                                  extra_args=extra, logprobs=n)
                                   for extra, n in zip(kinds, asks, strict=True)], use_tqdm=False)
    return {"prompts": [tokenizer(p)["input_ids"] for p in prompts], "results": results, "forwards": plain_forwards,
            "mixed": mixed, "llm": llm}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_real_engine_decodes_windows_as_the_reference(outputs):
    reference = ReferenceDecoder(load_transformers_model(MICRO_CHECKPOINT), mask_token_id=MASK_ID, window_size=W)
    tokens = 0
    for prompt, result in zip(outputs["prompts"], outputs["results"], strict=True):
        expected = reference.generate(prompt, StopRule(max_tokens=MAX_TOKENS, stop_token_ids=frozenset(STOP)))
        assert list(result.outputs[0].token_ids) == expected.token_ids
        tokens += len(expected.token_ids)
    windows = sum(outputs["forwards"])  # request-forwards with a window
    assert 0 < windows < tokens / 4, (windows, tokens)  # several tokens committed per window forward


def test_lossless_and_per_request_ar_requests_give_ar_tokens_in_the_real_engine(outputs):
    import torch

    model = load_transformers_model(MICRO_CHECKPOINT)
    for prompt, result in zip(outputs["prompts"][:2], outputs["mixed"][:2], strict=True):
        tokens = list(prompt)
        with torch.no_grad():  # AR decoding, greedy, the whole sequence each step
            for _ in range(MAX_TOKENS):
                tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
                if tokens[-1] in STOP:
                    break
        assert list(result.outputs[0].token_ids) == tokens[len(prompt):]
    assert [r.outputs[0].token_ids for r in outputs["mixed"][2:]] == [r.outputs[0].token_ids
                                                                       for r in outputs["results"][2:]]


def test_log_probs_come_back_through_the_real_engine(outputs):
    """The lossless request's tokens carry AR's log-probs, the plain one's those of the mask rows that
    filled them (the reference decoder's), each with the 2 likeliest tokens; the others none."""
    import torch

    def chosen(result) -> list[float]:
        out = result.outputs[0]
        assert all(len(entry) in (2, 3) for entry in out.logprobs)  # the top 2, and the token if not among them
        return [entry[token].logprob for entry, token in zip(out.logprobs, out.token_ids, strict=True)]

    model = load_transformers_model(MICRO_CHECKPOINT)
    prompt, result = outputs["prompts"][0], outputs["mixed"][0]
    tokens = list(result.outputs[0].token_ids)
    with torch.no_grad():
        rows = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float().log_softmax(-1)
    expected = rows.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(chosen(result), expected, strict=True)) < 1e-4
    reference = ReferenceDecoder(model, mask_token_id=MASK_ID, window_size=W)
    plain = reference.generate(outputs["prompts"][2], StopRule(max_tokens=MAX_TOKENS, stop_token_ids=frozenset(STOP)))
    assert max(abs(a - b) for a, b in zip(chosen(outputs["mixed"][2]), plain.logprobs, strict=True)) < 1e-4
    assert outputs["mixed"][1].outputs[0].logprobs is None and outputs["mixed"][3].outputs[0].logprobs is None


def test_the_plugin_entry_point_registers_the_v2_binding_on_this_vllm(outputs):
    """vLLM 0.34 has no V1 model runner: the plugin's entry point (which vLLM ran for the engine above)
    registered the V2 binding's model class, not the V1 adapter's."""
    from vllm import ModelRegistry

    from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE
    from vllm_wedlm.plugin import has_v1_model_runner
    from vllm_wedlm.v2.model import WeDLMForCausalLM

    assert not has_v1_model_runner()
    assert ModelRegistry._try_load_model_cls(ARCHITECTURE) is WeDLMForCausalLM


@pytest.mark.parametrize(("asks", "message"), [
    ({"extra_args": {"wedlm_entropy_treshold": 0.3}}, "unknown WeDLM key(s) 'wedlm_entropy_treshold'"),
    ({"extra_args": {"wedlm_lossless": "maybe"}}, "wedlm_lossless"),
])
def test_the_front_end_refuses_what_the_binding_cannot_serve_and_serves_on(outputs, asks, message):
    """The V2 binding's request validator (vLLM 0.34's front end runs it at admission) fails a request
    it cannot serve with a message that names what, and the engine serves the next request as before."""
    from vllm.exceptions import VLLMValidationError  # what vLLM 0.34 makes of a ValueError there (a 400)

    llm = outputs["llm"]
    with pytest.raises(VLLMValidationError, match=re.escape(message)):
        llm.generate(["1+1="], SamplingParams(temperature=0.0, max_tokens=8, **asks), use_tqdm=False)
    again = llm.generate([{"prompt_token_ids": outputs["prompts"][0]}],
                         SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=STOP), use_tqdm=False)
    assert again[0].outputs[0].token_ids == outputs["results"][0].outputs[0].token_ids


def test_prompt_log_probs_are_vllms_own_on_the_v2_binding(outputs):
    """prompt_logprobs come from vLLM 0.34's own worker on the prompt's hidden states, untouched by
    the WeDLM state: each prompt token's entry is the model's log-probability of it after the tokens
    before it, beside a WeDLM decode that still gives the reference's tokens."""
    import torch

    llm, prompt = outputs["llm"], outputs["prompts"][1]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=STOP, prompt_logprobs=2)
    result = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    entries = result.prompt_logprobs
    assert entries[0] is None and len(entries) == len(prompt)  # the first token has no context
    model = load_transformers_model(MICRO_CHECKPOINT)
    with torch.no_grad():
        rows = model(input_ids=torch.tensor([prompt])).logits[0, :-1].float().log_softmax(-1)  # [P - 1, V]
    expected = rows.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
    got = [entry[token].logprob for entry, token in zip(entries[1:], prompt[1:], strict=True)]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4
    assert all(len(entry) in (2, 3) for entry in entries[1:])  # the top 2, and the token if not among them
    assert result.outputs[0].token_ids == outputs["results"][1].outputs[0].token_ids


def test_an_engine_with_custom_logits_processors_refuses_to_start():
    """The V2 binding does not apply custom logits processors to canvas rows yet, so an engine given
    one stops at start-up with a message that names it, rather than serve as if it ran."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    class KeepsEverything(LogitsProcessor):
        def apply(self, logits, ctx):
            return logits

    cpu_engine.install()
    with pytest.raises(ValueError, match=r"custom logits processors \(.*KeepsEverything\)"):
        LLM(model=str(MICRO_CHECKPOINT), max_model_len=512, max_num_seqs=4, diffusion_config={"canvas_length": 2 * W},
            scheduler_cls="vllm_wedlm.v2.scheduler.WeDLMScheduler", logits_processors=[QUALNAME, KeepsEverything],
            **cpu_engine.ENGINE_ARGS)


def grammar_ar(model, tokenizer, prompt: list[int], regex: str, max_tokens: int) -> list[int]:
    """AR decoding (greedy) under a regular expression, with xgrammar's own matcher (independent of the
    binding's grammar stage): each token the likeliest the grammar allows."""
    import torch
    import xgrammar as xgr

    vocab = model.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=STOP)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex(regex))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1:].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            tokens.append(int(logits[0].argmax()))
            assert matcher.accept_token(tokens[-1])
            if tokens[-1] in STOP:
                break
    return tokens[len(prompt):]


def test_structured_outputs_hold_in_every_kind_of_window(outputs):
    """Structured outputs on V2 (``v2/grammar_stage.py``): a plain request's text matches its regular
    expression (its first undecided slot drawn under the grammar, runs cut where the grammar rejects a
    fill); a lossless and a per-request AR request give AR's tokens under the grammar, token for token
    (xgrammar's own matcher here); a request without one beside them gives the reference's tokens."""
    from vllm.sampling_params import StructuredOutputsParams

    llm, prompt = outputs["llm"], outputs["prompts"][0]
    tokenizer = llm.get_tokenizer()
    regex = r"The answer is (1[0-9]|2[0-9])\."
    kinds = {"plain": None, "lossless": {"wedlm_lossless": True}, "ar": {"wedlm_decoding": "ar"}}
    params = [SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=STOP, extra_args=extra,
                             structured_outputs=StructuredOutputsParams(regex=regex)) for extra in kinds.values()]
    params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=STOP))
    results = llm.generate([{"prompt_token_ids": prompt}] * 4, params, use_tqdm=False)
    got = dict(zip([*kinds, "free"], (list(r.outputs[0].token_ids) for r in results), strict=True))
    assert re.fullmatch(regex, tokenizer.decode([t for t in got["plain"] if t not in STOP])), got["plain"]
    expected = grammar_ar(load_transformers_model(MICRO_CHECKPOINT), tokenizer, prompt, regex, 24)
    assert re.fullmatch(regex, tokenizer.decode([t for t in expected if t not in STOP]))
    assert got["lossless"] == expected and got["ar"] == expected
    assert got["free"] == list(outputs["results"][0].outputs[0].token_ids)
