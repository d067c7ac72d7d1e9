"""A transformers Qwen2/Qwen3 AR checkpoint converted to WeDLM, then served by vLLM."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from engines import running_llm, vllm_prompt_logprobs
from vllm_wedlm.checkpoints.corpus import corpus
from vllm_wedlm.checkpoints.tiny import CHAT_TEMPLATE, train_bpe_tokenizer
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.training.conversion.convert import convert

SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False)


def qwen_checkpoint(path, variant: str, spare_rows: bool):
    """A random Qwen AR checkpoint whose tokenizer has no mask token; its embedding matrix has
    padded rows beyond the tokenizer (as Qwen's have) or exactly one row per token."""
    no_mask = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe_tokenizer(corpus(0), 400, special_tokens=no_mask),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE,
    )
    vocab_rows = -(-len(tokenizer) // 64) * 64 if spare_rows else len(tokenizer)
    torch.manual_seed(0)
    if variant == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_rows, head_dim=32, **SHAPES))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_rows, **SHAPES))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model.eval(), tokenizer


# qwen3: spare padded rows hold the new mask token; qwen2: the matrix has to grow.
@pytest.mark.parametrize("variant,spare_rows", [("qwen3", True), ("qwen2", False)])
def test_converted_checkpoint_serves_like_its_source(tmp_path, variant, spare_rows):
    source, tokenizer = qwen_checkpoint(tmp_path / "ar", variant, spare_rows)
    vocab_rows = source.get_input_embeddings().weight.shape[0]
    out = convert(tmp_path / "ar", tmp_path / "wedlm")
    config = WeDLMConfig.from_pretrained(out)
    assert config.model_type == "wedlm" and config.architectures == ["WeDLMForCausalLM"]
    assert config.qk_norm is (variant == "qwen3") and config.attention_bias is (variant == "qwen2")
    assert config.mask_token_id == len(tokenizer)  # the new token, right after the old ones
    # Spare rows are reused; otherwise the matrix grows by the mask token's row alone (vLLM samples
    # every row up to vocab_size: padded rows with untrained weights could be drawn).
    assert config.vocab_size == (vocab_rows if spare_rows else vocab_rows + 1)
    converted = load_transformers_model(out)
    with running_llm(out, dtype="float32", max_logprobs=-1) as llm:
        ids, engine_logprobs = vllm_prompt_logprobs(llm, "The quiet river reads 1, 2, 3")
    with torch.no_grad():
        source_logits = source(torch.tensor([ids])).logits[0, :-1]
        converted_logits = converted(torch.tensor([ids])).logits[0, :-1]
    torch.testing.assert_close(converted_logits[:, :vocab_rows], source_logits)  # same weights
    expected = torch.log_softmax(converted_logits, dim=-1)
    torch.testing.assert_close(engine_logprobs, expected, atol=1e-4, rtol=0)  # see test_engine_parity
