"""Turn a transformers Qwen2/Qwen3 causal LM into a WeDLM checkpoint (and optionally train it).

A WeDLM model has its base model's weights and layout (research/wedlm.md 1.2); what changes is
the config (``model_type: wedlm``, ``architectures: [WeDLMForCausalLM]``, ``qk_norm``,
``attention_bias``, ``mask_token_id``) and a mask token the tokenizer knows. When the tokenizer
has no mask token, one is added, reusing a padded embedding row where the matrix has spare rows
(as Qwen's 151936-row matrices do) and growing the matrix otherwise.

    python -m vllm_wedlm.training.convert QWEN_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vllm_wedlm.checkpoints.tiny import CHAT_TEMPLATE
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
from vllm_wedlm.plugin import ARCHITECTURE, MODEL_TYPE

MASK_TOKEN = "<|mask|>"
_BODIES = {"qwen2": {"qk_norm": False, "attention_bias": True}, "qwen3": {"qk_norm": True}}


def add_mask_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, mask_token: str = MASK_TOKEN) -> int:
    """Make sure the tokenizer has ``mask_token`` and the model an embedding row for it; its id."""
    if mask_token not in tokenizer.get_vocab():
        tokenizer.add_tokens([mask_token], special_tokens=True)
    mask_id = tokenizer.convert_tokens_to_ids(mask_token)
    if mask_id >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(mask_id + 1, pad_to_multiple_of=64)
    return mask_id


def wedlm_config(model: PreTrainedModel, mask_token_id: int) -> dict:
    """The published-format WeDLM config.json of a transformers Qwen2/Qwen3 model."""
    model_type = model.config.model_type
    if model_type not in _BODIES:
        raise ValueError(f"only Qwen2 and Qwen3 causal LMs convert to WeDLM, not model_type {model_type!r}")
    config = model.config.to_dict()
    config.update(_BODIES[model_type])
    config.update(
        architectures=[ARCHITECTURE],
        model_type=MODEL_TYPE,
        auto_map={
            "AutoConfig": "configuration_wedlm.WeDLMConfig",
            "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM",
        },
        mask_token_id=mask_token_id,
        vocab_size=model.get_input_embeddings().weight.shape[0],
    )
    return dict(sorted(config.items()))


def save_wedlm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, mask_token_id: int) -> Path:
    """Write model, tokenizer and WeDLM config; checks that the config loads as a WeDLMConfig."""
    out = Path(out_dir)
    model.save_pretrained(out)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(wedlm_config(model, mask_token_id), indent=2) + "\n")
    WeDLMConfig.from_pretrained(out)  # raises if the body flags are not a published combination
    return out


def convert(src: str | Path, out_dir: str | Path, mask_token: str = MASK_TOKEN) -> Path:
    """Convert a Qwen2/Qwen3 checkpoint directory into a WeDLM checkpoint (weights unchanged)."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(src)
    return save_wedlm(model, tokenizer, out_dir, add_mask_token(model, tokenizer, mask_token))


def train_from_pretrained(src: str | Path, out_dir: str | Path, recipe, device: torch.device) -> Path:
    """Fine-tune a Qwen2/Qwen3 AR model with WeDLM's objective on the task mixture; save as WeDLM."""
    from vllm_wedlm.training.train import Vocabulary, train, training_samples
    from vllm_wedlm.training.tasks import mixture

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src)
    mask_id = add_mask_token(model, tokenizer)
    if "<|im_end|>" not in tokenizer.get_vocab():
        raise ValueError("the tokenizer has no <|im_end|>; WeDLM's instruct format is ChatML")
    vocab = Vocabulary(
        encode=lambda text: tokenizer(text, add_special_tokens=False).input_ids,
        mask_token_id=mask_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        im_end_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    tasks = mixture(recipe.task_counts, "train", recipe.seed, recipe.max_number)
    samples = training_samples(tasks, vocab, recipe)
    train(model, samples, vocab, recipe, device=device)
    return save_wedlm(model.to("cpu"), tokenizer, out_dir, mask_id)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert a transformers Qwen2/Qwen3 causal LM to a WeDLM checkpoint.")
    parser.add_argument("src")
    parser.add_argument("out_dir")
    parser.add_argument("--mask-token", default=MASK_TOKEN)
    args = parser.parse_args(argv)
    print(convert(args.src, args.out_dir, args.mask_token))


if __name__ == "__main__":
    main()
