"""Turn a transformers Qwen2/Qwen3 causal LM into a WeDLM checkpoint.

A WeDLM model has its base model's weights and layout (research/wedlm.md 1.2); what changes is
the config (``model_type: wedlm``, ``architectures: [WeDLMForCausalLM]``, ``qk_norm``,
``attention_bias``, ``mask_token_id``) and a mask token the tokenizer knows. When the tokenizer
has no mask token, one is added, reusing a padded embedding row where the matrix has spare rows
(as Qwen's 151936-row matrices do) and growing the matrix otherwise.

    python -m vllm_wedlm.training.convert QWEN_DIR OUT_DIR

To train such a model with WeDLM's objective as well: ``python -m vllm_wedlm.training OUT_DIR
--from-pretrained QWEN_DIR`` (train.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vllm_wedlm.checkpoints.tiny import CHAT_TEMPLATE, MASK_TOKEN
from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, AUTO_MAP, BODIES, MODEL_TYPE, WeDLMConfig


def add_mask_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, mask_token: str = MASK_TOKEN) -> int:
    """Make sure the tokenizer has ``mask_token`` and the model an embedding row for it; its id."""
    if mask_token not in tokenizer.get_vocab():
        tokenizer.add_tokens([mask_token], special_tokens=True)
    mask_id = tokenizer.convert_tokens_to_ids(mask_token)
    if mask_id >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(mask_id + 1, pad_to_multiple_of=64)
    return mask_id


def add_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give a tokenizer without a chat template (a base model's) the ChatML one of WeDLM's instruct models."""
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE


def wedlm_config(model: PreTrainedModel, mask_token_id: int) -> dict:
    """The published-format WeDLM config.json of a transformers Qwen2/Qwen3 model."""
    model_type = model.config.model_type
    if model_type not in BODIES:
        raise ValueError(f"only Qwen2 and Qwen3 causal LMs convert to WeDLM, not model_type {model_type!r}")
    config = model.config.to_dict()
    # The body fixes the flags that its Qwen config class has no field for (Qwen2: both); a flag the
    # class has (Qwen3's attention_bias) is the model's own, and save_wedlm checks it.
    fields = {field.name for field in dataclasses.fields(model.config)}
    config.update({flag: value for flag, value in BODIES[model_type].items() if flag not in fields})
    config.update(
        architectures=[ARCHITECTURE],
        model_type=MODEL_TYPE,
        auto_map=dict(AUTO_MAP),
        mask_token_id=mask_token_id,
        vocab_size=model.get_input_embeddings().weight.shape[0],
    )
    return dict(sorted(config.items()))


def save_wedlm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
               mask_token_id: int) -> Path:
    """Write model, tokenizer and WeDLM config; checks that the config loads as a WeDLMConfig."""
    out = Path(out_dir)
    model.save_pretrained(out)
    add_chat_template(tokenizer)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(wedlm_config(model, mask_token_id), indent=2) + "\n")
    WeDLMConfig.from_pretrained(out)  # raises if the body flags are not a published combination
    return out


def convert(src: str | Path, out_dir: str | Path, mask_token: str = MASK_TOKEN) -> Path:
    """Convert a Qwen2/Qwen3 checkpoint directory into a WeDLM checkpoint (weights unchanged)."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(src)
    return save_wedlm(model, tokenizer, out_dir, add_mask_token(model, tokenizer, mask_token))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert a transformers Qwen2/Qwen3 causal LM to a WeDLM checkpoint.")
    parser.add_argument("src")
    parser.add_argument("out_dir")
    parser.add_argument("--mask-token", default=MASK_TOKEN)
    args = parser.parse_args(argv)
    print(convert(args.src, args.out_dir, args.mask_token))


if __name__ == "__main__":
    main()
