"""Tiny WeDLM checkpoints: random weights, a locally trained tokenizer, the published config format.

Both published bodies are available (``BODIES`` in models/configuration_wedlm.py): ``qwen2``
(WeDLM-7B style) and ``qwen3`` (WeDLM-8B style). The output is a pure function of the arguments:
the same seed gives byte-identical files. Random weights prove correctness, not speed; set
``logit_scale`` above 1 to sharpen the output distribution (a scaled ``lm_head``) so that a model
is confident about some positions, as WeDLM's parallel decoding needs to be exercised.

    python -m vllm_wedlm.checkpoints.tiny OUT_DIR --variant qwen3 --seed 0
    vllm-wedlm-make-tiny OUT_DIR --variant qwen2
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from vllm_wedlm.checkpoints.corpus import corpus
from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, AUTO_MAP, BODIES, MODEL_TYPE, WeDLMConfig
from vllm_wedlm.models.transformers_body import model_for

MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", MASK_TOKEN)
# ChatML, as the Qwen and WeDLM instruct models use.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The special tokens' roles in tokenizer_config.json.
_TOKEN_ROLES = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": MASK_TOKEN}


@dataclass(frozen=True)
class TinySpec:
    """Shapes and seed of a tiny checkpoint. head_dim 32 is the smallest vLLM's CPU attention takes."""

    variant: str = "qwen3"
    seed: int = 0
    vocab_target: int = 1000  # BPE vocabulary before special tokens; the model pads to a multiple of 64
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 1000000.0  # Qwen's; a small model on short chats learns positions faster with less
    logit_scale: float = 1.0
    dtype: str = "bfloat16"


def train_tokenizer(seed: int, vocab_target: int) -> Tokenizer:
    """A byte-level BPE tokenizer (as Qwen's) trained on the deterministic corpus."""
    return train_bpe_tokenizer(corpus(seed), vocab_target)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_target: int, split_digits: bool = False, special_tokens: Iterable[str] = SPECIAL_TOKENS
) -> Tokenizer:
    """A byte-level BPE tokenizer with WeDLM's special tokens, trained on ``texts``.

    ``split_digits`` makes every digit its own token, as Qwen's tokenizer does: numbers then
    share one small set of embeddings, which small models learn arithmetic from far faster.
    """
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens(list(special_tokens))
    return tokenizer


def published_config(spec: TinySpec, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json in the layout of the published WeDLM checkpoints (research/wedlm.md 1.1)."""
    config = {
        "architectures": [ARCHITECTURE],
        "auto_map": dict(AUTO_MAP),
        **BODIES[spec.variant],
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": spec.intermediate_size,
        "layer_types": ["full_attention"] * spec.num_hidden_layers,
        "mask_token_id": ids[MASK_TOKEN],
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_hidden_layers,
        "model_type": MODEL_TYPE,
        "num_attention_heads": spec.num_attention_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "pad_token_id": ids["<|endoftext|>"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": spec.dtype,
        "transformers_version": "4.56.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    if spec.variant == "qwen3":  # Qwen3 configs name head_dim; Qwen2.5 configs derive it
        config["head_dim"] = spec.hidden_size // spec.num_attention_heads
    return dict(sorted(config.items()))


def make_tiny_checkpoint(out_dir: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write a complete tiny WeDLM checkpoint with random weights into ``out_dir``; return its path."""
    return write_checkpoint(out_dir, train_tokenizer(spec.seed, spec.vocab_target), spec)


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def config_for(spec: TinySpec, tokenizer: Tokenizer) -> dict:
    """The published-format config.json of a model with ``spec``'s shapes and this tokenizer."""
    if spec.variant not in BODIES:
        raise ValueError(f"variant must be one of {sorted(BODIES)}, got {spec.variant!r}")
    ids = special_token_ids(tokenizer)
    vocab_size = -(-tokenizer.get_vocab_size() // 64) * 64  # padded rows, like Qwen's 151936
    return published_config(spec, vocab_size, ids)


def random_model(spec: TinySpec, config: dict) -> PreTrainedModel:
    """transformers' Qwen model for ``config``, initialised from ``spec.seed`` (float32)."""
    torch.manual_seed(spec.seed)
    model = model_for(WeDLMConfig(**{k: v for k, v in config.items() if k != "auto_map"}))
    with torch.no_grad():
        model.lm_head.weight.mul_(spec.logit_scale)
    return model


def write_checkpoint(
    out_dir: str | Path, tokenizer: Tokenizer, spec: TinySpec, model: PreTrainedModel | None = None
) -> Path:
    """Write tokenizer, configs and weights (``model``'s, or random ones) in the WeDLM format."""
    out = Path(out_dir)
    config = config_for(spec, tokenizer)
    if model is None:
        model = random_model(spec, config)
    write_model_files(out, tokenizer, spec, config)
    dtype = getattr(torch, spec.dtype)
    state = {name: t.detach().to("cpu", dtype).contiguous() for name, t in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_model_files(out: Path, tokenizer: Tokenizer, spec: TinySpec, config: dict) -> None:
    """Everything of a checkpoint but its weights: enough for vLLM's ``load_format="dummy"``."""
    ids = special_token_ids(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **_TOKEN_ROLES,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    })
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    })
    _write_json(out / "tiny_spec.json", asdict(spec))


def chat_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """``tokenizer`` as transformers loads it from a checkpoint written here: with the chat template
    and the special tokens' roles of its tokenizer_config.json."""
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=CHAT_TEMPLATE, **_TOKEN_ROLES)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random WeDLM checkpoint.")
    parser.add_argument("out_dir")
    defaults = TinySpec()
    parser.add_argument("--variant", choices=sorted(BODIES), default=defaults.variant)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--num-hidden-layers", type=int, default=defaults.num_hidden_layers)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--logit-scale", type=float, default=defaults.logit_scale)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=defaults.dtype)
    args = parser.parse_args(argv)
    spec = TinySpec(
        variant=args.variant, seed=args.seed, num_hidden_layers=args.num_hidden_layers,
        hidden_size=args.hidden_size, logit_scale=args.logit_scale, dtype=args.dtype,
    )
    path = make_tiny_checkpoint(args.out_dir, spec)
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"wrote {spec.variant} WeDLM checkpoint to {path} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
