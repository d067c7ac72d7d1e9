"""WeDLMConfig reads the published config.json format, with trust_remote_code off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import add_remote_code_sentinels
from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint
from vllm_wedlm.models.configuration_wedlm import DEFAULT_MASK_TOKEN_ID, WeDLMConfig, body_of

ROOT = Path(__file__).resolve().parents[1]

# The fields of tencent/WeDLM-8B-Instruct's config.json (research/wedlm.md 1.1), sizes shrunk.
PUBLISHED_8B_STYLE = {
    "architectures": ["WeDLMForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_wedlm.WeDLMConfig",
                 "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 12288, "layer_types": ["full_attention"] * 36, "mask_token_id": None,
    "max_position_embeddings": 16384, "max_window_layers": 36, "model_type": "wedlm",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "qk_norm": True,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.56.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_published_8b_config():
    config = WeDLMConfig(**{k: v for k, v in PUBLISHED_8B_STYLE.items() if k != "model_type"})
    assert config.mask_token_id == DEFAULT_MASK_TOKEN_ID == 151665
    assert config.body == "qwen3"
    assert config.head_dim == 128
    assert config.rope_parameters["rope_theta"] == 1e6


def test_published_7b_config_without_head_dim_or_mask_id():
    fields = {k: v for k, v in PUBLISHED_8B_STYLE.items() if k not in ("model_type", "head_dim", "mask_token_id")}
    fields.update(attention_bias=True, qk_norm=False, hidden_size=3584, num_attention_heads=28,
                  num_key_value_heads=4, intermediate_size=18944, num_hidden_layers=28,
                  layer_types=["full_attention"] * 28)
    config = WeDLMConfig(**fields)
    assert config.body == "qwen2"
    assert config.head_dim == 3584 // 28
    assert config.mask_token_id == 151665


def test_explicit_mask_token_id_is_kept():
    assert WeDLMConfig(mask_token_id=7, vocab_size=64).mask_token_id == 7


@pytest.mark.parametrize("bias,qk_norm", [(False, False), (True, True)])
def test_unpublished_flag_combinations_are_refused(bias, qk_norm):
    config = WeDLMConfig(attention_bias=bias, qk_norm=qk_norm)
    with pytest.raises(ValueError, match=r"qwen2-style \(attention_bias=True, qk_norm=False\) or qwen3-style"):
        body_of(config)


@pytest.fixture(scope="module")
def checkpoint_with_remote_code(tmp_path_factory):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("remote") / "ckpt", TinySpec(variant="qwen2"))
    add_remote_code_sentinels(path)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "wedlm" and "AutoConfig" in config["auto_map"]
    return path


# Loads a WeDLM checkpoint with plain transformers in a fresh interpreter (nothing of vLLM's
# registration can leak in) after only `import vllm_wedlm`, trust_remote_code left at its default
# and then off. stdin is closed: transformers asks "Do you wish to run the custom code? [y/N]" on
# a checkpoint with auto_map and no local class, and the question must never come.
TRANSFORMERS_ONLY = """
import json, sys
import torch
import vllm_wedlm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
config = AutoConfig.from_pretrained(path)
strict = AutoConfig.from_pretrained(path, trust_remote_code=False)
# transformers' rule for a registered class: it wins over auto_map even where remote code is allowed.
trusted = AutoConfig.from_pretrained(path, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(path)
AutoTokenizer.from_pretrained(path, trust_remote_code=False)
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, dtype=torch.float32)
from vllm_wedlm.models.transformers_body import load_transformers_model
ids = torch.tensor([tokenizer.encode("1, 2, 3, 4")])
with torch.no_grad():
    same_logits = torch.equal(model(ids).logits, load_transformers_model(path)(ids).logits)
print()  # ends a question transformers may have left on the line
print("RESULT", json.dumps({
    "config": type(config).__module__ + "." + type(config).__name__,
    "strict_config": type(strict).__name__,
    "trusted_config": type(trusted).__name__,
    "body": config.body,
    "mask_token": tokenizer.convert_ids_to_tokens(config.mask_token_id),
    "has_chat_template": bool(tokenizer.chat_template),
    "model": type(model).__name__,
    "same_logits": same_logits,
    "vllm_imported": "vllm" in sys.modules,
}))
"""

# The benchmark harness loads its tokenizer before vLLM has registered anything.
BENCHMARK_WORKLOAD = """
import argparse, json, sys
from benchmarks.cli import _workloads
args = argparse.Namespace(kinds="counting", requests=2, shots="0")
prompts = _workloads(args, sys.argv[1])[0]["counting"]
print()  # ends a question transformers may have left on the line
print("RESULT", json.dumps({"prompts": len(prompts), "chatml": prompts[0].text.startswith("<|im_start|>")}))
"""


def run_fresh(code: str, *args: str) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter with stdin closed; it prints ``RESULT <json>`` last."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, cwd=ROOT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return json.loads(done.stdout.rsplit("RESULT ", 1)[1]), output


def test_importing_the_package_makes_plain_transformers_load_wedlm_checkpoints(checkpoint_with_remote_code):
    result, output = run_fresh(TRANSFORMERS_ONLY, str(checkpoint_with_remote_code))
    assert result == {
        "config": "vllm_wedlm.models.configuration_wedlm.WeDLMConfig",
        "strict_config": "WeDLMConfig",
        "trusted_config": "WeDLMConfig",
        "body": "qwen2",
        "mask_token": "<|mask|>",
        "has_chat_template": True,
        "model": "Qwen2ForCausalLM",  # transformers' own body, the weights of a WeDLM model
        "same_logits": True,
        "vllm_imported": False,
    }
    assert "custom code" not in output and "trust_remote_code" not in output, output[-3000:]


def test_the_benchmark_harness_loads_the_tokenizer_without_asking(checkpoint_with_remote_code):
    result, output = run_fresh(BENCHMARK_WORKLOAD, str(checkpoint_with_remote_code))
    assert result == {"prompts": 2, "chatml": True}
    assert "custom code" not in output and "trust_remote_code" not in output, output[-3000:]


def test_vllm_config_parser_loads_auto_map_checkpoint_without_remote_code(checkpoint_with_remote_code):
    import vllm_wedlm

    vllm_wedlm.register()
    from vllm.engine.arg_utils import EngineArgs

    engine_config = EngineArgs(
        model=str(checkpoint_with_remote_code), trust_remote_code=False, max_model_len=256,
        enforce_eager=True, kv_cache_memory_bytes=1 << 26,
    ).create_engine_config()
    model_config = engine_config.model_config
    assert type(model_config.hf_config) is WeDLMConfig
    assert model_config.architecture == "WeDLMForCausalLM"
    assert not model_config.trust_remote_code


def test_the_remote_code_sentinel_has_teeth(checkpoint_with_remote_code):
    """Loading the checkpoint's auto_map class runs its file and fails: the tests above really
    avoided the remote code."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    with pytest.raises(RuntimeError, match="remote code of the checkpoint was executed"):
        get_class_from_dynamic_module("configuration_wedlm.WeDLMConfig", str(checkpoint_with_remote_code))
