"""WeDLMConfig reads the published config.json format, with trust_remote_code off."""

from __future__ import annotations

import json

import pytest

from conftest import add_remote_code_sentinels
from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint
from vllm_wedlm.models.configuration_wedlm import DEFAULT_MASK_TOKEN_ID, WeDLMConfig, body_of

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
    assert config.body == "Qwen3"
    assert config.head_dim == 128
    assert config.rope_parameters["rope_theta"] == 1e6


def test_published_7b_config_without_head_dim_or_mask_id():
    fields = {k: v for k, v in PUBLISHED_8B_STYLE.items() if k not in ("model_type", "head_dim", "mask_token_id")}
    fields.update(attention_bias=True, qk_norm=False, hidden_size=3584, num_attention_heads=28,
                  num_key_value_heads=4, intermediate_size=18944, num_hidden_layers=28,
                  layer_types=["full_attention"] * 28)
    config = WeDLMConfig(**fields)
    assert config.body == "Qwen2"
    assert config.head_dim == 3584 // 28
    assert config.mask_token_id == 151665


def test_explicit_mask_token_id_is_kept():
    assert WeDLMConfig(mask_token_id=7, vocab_size=64).mask_token_id == 7


@pytest.mark.parametrize("bias,qk_norm", [(False, False), (True, True)])
def test_unpublished_flag_combinations_are_refused(bias, qk_norm):
    config = WeDLMConfig(attention_bias=bias, qk_norm=qk_norm)
    with pytest.raises(ValueError, match="Qwen2-style .* or Qwen3-style"):
        body_of(config)


@pytest.fixture(scope="module")
def checkpoint_with_remote_code(tmp_path_factory):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("remote") / "ckpt", TinySpec(variant="qwen2"))
    add_remote_code_sentinels(path)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "wedlm" and "AutoConfig" in config["auto_map"]
    return path


def test_transformers_loads_auto_map_checkpoint_without_remote_code(checkpoint_with_remote_code):
    import vllm_wedlm

    vllm_wedlm.register()
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(checkpoint_with_remote_code, trust_remote_code=False)
    assert type(config) is WeDLMConfig
    assert config.body == "Qwen2" and not config.qk_norm and config.attention_bias
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_with_remote_code, trust_remote_code=False)
    assert tokenizer.convert_ids_to_tokens(config.mask_token_id) == "<|mask|>"


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
