"""The CUDA graph settings of WeDLM mode, checked on CPU with vLLM's own config objects.

A GPU runs them (README, "Tests on a GPU"); here: the mode and sizes the config hook chooses, and
the sequence lengths a graph capture of a mixed batch gets, which must fit the block table.
"""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig, CUDAGraphMode
from vllm.engine.arg_utils import EngineArgs

from vllm_wedlm.adapter.config_hook import configure_cuda_graphs, graph_sizes
from vllm_wedlm.adapter.model_runner import capture_seq_len
from vllm_wedlm.checkpoints import MICRO_CHECKPOINT


def _wedlm_config(dtype="bfloat16", attention_backend=None, **overrides):
    """vLLM's config of the micro model in WeDLM mode (built on CPU), with a fresh compilation config
    as the config hook sees it on CUDA: nothing chosen yet unless ``overrides`` choose it."""
    config = EngineArgs(model=str(MICRO_CHECKPOINT), max_model_len=512, additional_config={"decoding": "wedlm"},
                        max_num_seqs=64, max_num_batched_tokens=2048, dtype=dtype,
                        attention_backend=attention_backend).create_engine_config()
    config.compilation_config = CompilationConfig(**overrides)
    config.model_config.enforce_eager = False
    return config


def test_wedlm_steps_replay_full_graphs_up_to_every_running_window():
    config = _wedlm_config()
    configure_cuda_graphs(config, 64 * 32)
    compilation = config.compilation_config
    assert compilation.cudagraph_mode == CUDAGraphMode.FULL
    assert compilation.cudagraph_capture_sizes == graph_sizes(2048)
    assert compilation.cudagraph_capture_sizes[-1] == 2048


@pytest.mark.parametrize("dtype, backend, full", [
    ("float16", None, True), ("bfloat16", "FLASH_ATTN", True), ("float32", None, False),
    ("float32", "FLEX_ATTENTION", False), ("bfloat16", "FLEX_ATTENTION", False), ("bfloat16", "TRITON_ATTN", False)])
def test_full_graphs_only_with_flash_attention(dtype, backend, full):
    """FlashAttention is vLLM's own pick for half precision; FlexAttention's FULL capture fails."""
    config = _wedlm_config(dtype=dtype, attention_backend=backend)
    configure_cuda_graphs(config, 64 * 32)
    compilation = config.compilation_config
    assert compilation.cudagraph_mode == (CUDAGraphMode.FULL if full else None)  # None: vLLM's default
    assert compilation.cudagraph_capture_sizes == graph_sizes(2048)


def test_a_users_graph_mode_and_sizes_stay():
    config = _wedlm_config(cudagraph_mode="PIECEWISE", cudagraph_capture_sizes=[1, 2, 4])
    configure_cuda_graphs(config, 64 * 32)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert config.compilation_config.cudagraph_capture_sizes == [1, 2, 4]


def test_eager_engines_get_no_graphs():
    config = _wedlm_config()
    config.model_config.enforce_eager = True
    configure_cuda_graphs(config, 64 * 32)
    assert config.compilation_config.cudagraph_mode is None
    assert config.compilation_config.cudagraph_capture_sizes is None


def test_graph_sizes_cover_every_token_count_with_little_padding():
    sizes = graph_sizes(2048)
    assert sizes[0] == 1 and sizes[-1] == 2048 and sizes == sorted(set(sizes))
    for tokens in range(1, 2049):
        padded = next(size for size in sizes if size >= tokens)
        assert padded - tokens < max(8, tokens // 7), (tokens, padded)


@pytest.mark.parametrize("max_num_seqs, max_model_len", [(64, 368), (64, 4096), (1, 40), (16, 100), (7, 50),
                                                         (256, 512)])
def test_capture_sequences_fit_the_block_table_and_hold_their_tokens(max_num_seqs, max_model_len):
    """vLLM's ``_dummy_run`` splits a mixed batch of N tokens over min(N, max_num_seqs) requests, the
    last one taking the remainder, each with a sequence of N tokens unless told otherwise; its graph
    memory profile tells it min(max_model_len, max_num_batched_tokens // N)."""
    max_num_batched_tokens = max_num_seqs * 32
    for tokens in graph_sizes(max_num_batched_tokens):
        requests = min(tokens, max_num_seqs)
        queries = [tokens // requests] * requests
        queries[-1] += tokens % requests
        for requested in (None, min(max_model_len, max_num_batched_tokens // tokens), max_model_len):
            seq_len = capture_seq_len(tokens, max_num_seqs, max_model_len, requested)
            asked = tokens if requested is None else requested
            valid = max(queries) <= asked <= max_model_len
            if valid:
                assert seq_len == asked  # vLLM's own length is kept where it is valid
                continue
            assert seq_len >= max(queries)  # every request's tokens are in its sequence
            assert seq_len <= max(max_model_len, max(queries))  # and it reads no block past max_model_len
            assert seq_len == max_model_len or seq_len == max(queries)


def test_the_graph_memory_profile_gets_sequences_that_hold_a_window_step():
    """A WeDLM engine's largest capture, 256 requests of 32 tokens (W 16, max_num_batched_tokens
    8192, max_model_len 512), for which vLLM's profile asks min(512, 8192 // 8192) = 1 token."""
    assert capture_seq_len(8192, 256, 512, requested=1) == 32
