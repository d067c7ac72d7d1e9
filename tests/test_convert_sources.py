"""Conversion of Llama-family sources, and refusals that leave nothing behind (transformers only, no engine).

tests/test_smollm2.py converts a real Llama-family model and serves it in vLLM; here small random
models cover what a real one cannot: untied embeddings, another rope theta, a license file, and
sources that must be refused.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vllm_wedlm.checkpoints.corpus import corpus
from vllm_wedlm.checkpoints.tiny import CHAT_TEMPLATE, train_bpe_tokenizer
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.training.conversion.convert import ConversionError, add_mask_token, convert, save_wedlm
from vllm_wedlm.training.conversion.sources import SourceError, plain_qwen_model

NO_MASK = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LICENSE = "Example license text of the source model.\n"


def tokenizer(vocab: int = 400) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe_tokenizer(corpus(0), vocab, special_tokens=NO_MASK),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE,
    )


def llama_checkpoint(path, **overrides):
    tok = tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         **overrides)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "LICENSE").write_text(LICENSE)
    return model, tok


def test_llama_becomes_an_exact_qwen2_body(tmp_path):
    llama, tok = llama_checkpoint(tmp_path / "llama")
    out = convert(tmp_path / "llama", tmp_path / "wedlm")
    config = WeDLMConfig.from_pretrained(out)
    assert config.body == "qwen2" and config.rope_parameters["rope_theta"] == 10000.0
    assert not config.tie_word_embeddings and config.vocab_size == len(tok) + 1 == config.mask_token_id + 1
    ids = torch.tensor([tok("def f(x):\n    return x + 1  # 42", add_special_tokens=False).input_ids])
    with torch.no_grad():
        expected = llama(ids).logits
        actual = load_transformers_model(out)(ids).logits[..., : len(tok)]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    assert (out / "LICENSE").read_text() == LICENSE
    assert "Qwen2 body" in (out / "PROVENANCE.md").read_text()


def assert_nothing_written(parent, out):
    assert not out.exists()
    assert not [p for p in parent.iterdir() if ".partial-" in p.name]


def test_unconvertible_sources_are_refused_before_anything_is_written(tmp_path):
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(SourceError, match="model_type 'gpt2'"):
        convert(tmp_path / "gpt2", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")
    llama_checkpoint(tmp_path / "biased", attention_bias=True)
    with pytest.raises(SourceError, match="o_proj"):
        convert(tmp_path / "biased", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")
    with pytest.raises(SourceError, match="no GGUF file"):
        convert(tmp_path / "missing.gguf", tmp_path / "out")
    assert_nothing_written(tmp_path, tmp_path / "out")


def test_an_existing_output_folder_is_left_alone(tmp_path):
    llama_checkpoint(tmp_path / "llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="not empty"):
        convert(tmp_path / "llama", tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_a_checkpoint_failing_its_checks_is_removed(tmp_path):
    """The tokenizer check runs on the written files: a tokenizer that splits differently from the
    source's refuses the checkpoint, and the staging folder goes with it."""
    model, tok = llama_checkpoint(tmp_path / "llama")
    qwen = plain_qwen_model(model, "llama", torch.float32)
    mask_id = add_mask_token(qwen, tok)
    with pytest.raises(ConversionError, match="splits"):
        save_wedlm(qwen, tok, tmp_path / "out", mask_id, source_tokenizer=tokenizer(vocab=300))
    assert_nothing_written(tmp_path, tmp_path / "out")
    assert save_wedlm(qwen, tok, tmp_path / "out", mask_id).is_dir()  # the same model, its own tokenizer
