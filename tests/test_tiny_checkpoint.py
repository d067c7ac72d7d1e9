"""The tiny-checkpoint factory: deterministic, small, in the published WeDLM format."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from vllm_wedlm.checkpoints.tiny import SPECIAL_TOKENS, TinySpec, make_tiny_checkpoint


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = make_tiny_checkpoint(tmp_path / "a", TinySpec(seed=3))
    b = make_tiny_checkpoint(tmp_path / "b", TinySpec(seed=3))
    c = make_tiny_checkpoint(tmp_path / "c", TinySpec(seed=4))
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


@pytest.mark.parametrize("variant,bias,qk_norm", [("qwen2", True, False), ("qwen3", False, True)])
def test_published_format_and_tensors(tmp_path, variant, bias, qk_norm):
    path = make_tiny_checkpoint(tmp_path / variant, TinySpec(variant=variant))
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "wedlm"
    assert config["architectures"] == ["WeDLMForCausalLM"]
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
    assert (config["attention_bias"], config["qk_norm"]) == (bias, qk_norm)
    assert config["rope_scaling"] is None and config["torch_dtype"] == "bfloat16"
    assert ("head_dim" in config) == (variant == "qwen3")  # as in the Qwen2.5 / Qwen3 configs

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("lm_head.weight").shape == (config["vocab_size"], config["hidden_size"])
        assert str(f.get_tensor("model.embed_tokens.weight").dtype) == "torch.bfloat16"
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == bias
    assert ("model.layers.0.self_attn.q_norm.weight" in names) == qk_norm
    assert "model.layers.1.mlp.gate_proj.weight" in names

    size_mb = sum(p.stat().st_size for p in path.iterdir()) / 1e6
    assert 0.2 < size_mb < 5


def test_tokenizer_and_chat_template(tmp_path):
    from transformers import AutoTokenizer

    path = make_tiny_checkpoint(tmp_path / "t", TinySpec())
    config = json.loads((path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(path)
    for token in SPECIAL_TOKENS:
        (token_id,) = tokenizer.convert_tokens_to_ids([token])
        assert token_id < config["vocab_size"]
        assert tokenizer.decode([token_id]) == token
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == config["mask_token_id"]
    text = "Ada has 12 apples. 1, 2, 3"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # The BPE really learned merges from the corpus: common text takes far fewer tokens than bytes.
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text) / 2
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vllm_wedlm.checkpoints.tiny", str(tmp_path / "cli"), "--variant", "qwen2",
         "--seed", "5"], capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote qwen2 WeDLM checkpoint" in done.stdout
    assert json.loads((tmp_path / "cli" / "tiny_spec.json").read_text())["seed"] == 5
