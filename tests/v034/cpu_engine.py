"""vLLM 0.34's real engine (``vllm.LLM``, the V2 runner) on a CPU-only machine, for tests.

No CPU build of vLLM 0.34 exists; its CUDA wheel runs here on the CPU platform with Triton's
interpreter (conftest.py) once three things its missing CPU extension provides are stood in for:

* ``torch.ops._C.init_cpu_memory_env``, called by ``CPUWorker.__init__`` (vllm/v1/worker/cpu_worker.py:72):
  a no-op (it binds the KV cache's memory to a NUMA node);
* the CPU attention backend's C++ kernels (vllm/v1/attention/backends/cpu_attn.py:265 scheduler
  metadata, :430/:488 KV writes, :451 attention): ``TorchCPUAttentionBackend`` below, registered over
  ``CPU_ATTN``, which writes the paged KV cache and attends with torch's SDPA, one request at a time;
* the custom ops of the model's layers (e.g. ``torch.ops._C.rotary_embedding``, vllm/_custom_ops.py:184):
  ``custom_ops=["none"]`` selects their torch forms.

The engine must run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, conftest.py): the stand-ins
are installed here, not in a spawned engine core. Its KV cache is sized explicitly (vLLM's CPU
default takes most of the machine's memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

#: What every engine here is started with, beside its model and mode.
ENGINE_ARGS = dict(dtype="float32", enforce_eager=True, compilation_config={"custom_ops": ["none"]},
                   kv_cache_memory_bytes=1 << 26, async_scheduling=False, enable_prefix_caching=False, seed=0)

_library: torch.library.Library | None = None


def install() -> None:
    """Install the stand-ins (idempotent)."""
    global _library
    if _library is None:
        _library = torch.library.Library("_C", "FRAGMENT")
        _library.define("init_cpu_memory_env(int[] nodes) -> ()")
        _library.impl("init_cpu_memory_env", lambda nodes: None, "CompositeExplicitAutograd")
        register_backend(AttentionBackendEnum.CPU_ATTN, f"{__name__}.TorchCPUAttentionBackend")


def _caches(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, kv_heads, block_size, 2 * head_size] -> its key and value halves, each
    [num_blocks, kv_heads, block_size, head_size] (the layout vLLM's CPU backend uses)."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.size()
    key_cache, value_cache = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)
    return key_cache, value_cache


class TorchBuilder(CPUAttentionMetadataBuilder):
    def build(self, common_prefix_len, common, fast_build=False) -> CPUAttentionMetadata:
        return CPUAttentionMetadata(
            num_actual_tokens=common.num_actual_tokens, max_query_len=common.max_query_len,
            query_start_loc=common.query_start_loc, max_seq_len=common.max_seq_len, seq_lens=common.seq_lens,
            block_table=common.block_table_tensor, slot_mapping=common.slot_mapping, scheduler_metadata=None,
            causal=common.causal)


class TorchImpl(CPUAttentionBackendImpl):
    """Decoder attention only: each request's query rows attend causally (the last row to the
    whole sequence) to its KV, read from the paged cache through its block table."""

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        key_cache, value_cache = _caches(kv_cache)
        slots = slot_mapping.long()
        live = slots >= 0  # padding rows have no slot
        block, offset = slots[live] // key_cache.shape[2], slots[live] % key_cache.shape[2]
        key_cache[block, :, offset] = key[: len(slots)][live].to(key_cache.dtype)
        value_cache[block, :, offset] = value[: len(slots)][live].to(value_cache.dtype)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None) -> torch.Tensor:
        if attn_metadata is None:  # a profiling run
            return output
        key_cache, value_cache = _caches(kv_cache)
        block_size = key_cache.shape[2]
        starts = attn_metadata.query_start_loc.tolist()
        out = output.view(output.shape[0], self.num_heads, self.head_size)
        for i, seq_len in enumerate(attn_metadata.seq_lens.tolist()):
            start, end = starts[i], starts[i + 1]
            if end == start:
                continue
            blocks = attn_metadata.block_table[i, : -(-seq_len // block_size)].long()
            k, v = (self._sequence(cache, blocks, seq_len).to(query.dtype) for cache in (key_cache, value_cache))
            q = query[start:end].view(end - start, self.num_heads, self.head_size).transpose(0, 1)
            rows = torch.arange(end - start)[:, None] + seq_len - (end - start)  # each row's position
            mask = torch.arange(seq_len)[None] <= rows
            out[start:end] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale).transpose(0, 1)
        return output

    def _sequence(self, cache: torch.Tensor, blocks: torch.Tensor, seq_len: int) -> torch.Tensor:
        """[num_heads, seq_len, head_size]: a request's keys or values, each KV head repeated for
        the query heads that share it."""
        per_head = cache[blocks].transpose(0, 1).reshape(self.num_kv_heads, -1, self.head_size)[:, :seq_len]
        return per_head.repeat_interleave(self.num_queries_per_kv, 0)


class TorchCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TorchImpl]:
        return TorchImpl

    @staticmethod
    def get_builder_cls() -> type[TorchBuilder]:
        return TorchBuilder
