"""vLLM settings for a small model on the machine at hand: CPU eager mode and a fixed KV budget.

For users as well as the tests, which is why it ships in the package: the evaluation
(``python -m vllm_wedlm.evaluation``, also run by ``vllm_wedlm.training.seeds``), the example
(examples/generate.py) and the benchmark harness start their engines with :func:`engine_kwargs`.
:func:`serve_args` is the tests' (their ``vllm serve`` processes). Serving a real model needs
none of this: vLLM's defaults fit it.
"""

from __future__ import annotations

import os
from typing import Any

#: KV cache size on the CPU. vLLM's CPU default reserves 92% of the NUMA node's memory, which
#: fails on a small shared machine; tiny models need a few MiB.
CPU_KV_CACHE_BYTES = 256 * 1024 * 1024

#: Set to 1 where several processes share one GPU (scripts/gpu_suite.py runs the tests in parallel):
#: engines then get the same fixed KV cache as on the CPU instead of a share of the GPU's memory.
#: That also skips vLLM's start-up memory profiling, which assumes that no other process allocates
#: or frees GPU memory meanwhile; the small utilization left only sets how much free memory vLLM
#: checks for at start-up.
SHARED_GPU_ENV = "VLLM_WEDLM_SHARED_GPU"


def on_gpu() -> bool:
    """Whether vLLM will run on a CUDA GPU, asked without initialising CUDA.

    ``torch.cuda.is_available()`` initialises the CUDA driver in this process, and CUDA does not
    survive a fork; vLLM's own platform detection asks NVML instead.
    """
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


def engine_kwargs(**overrides: Any) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for a small model on this machine.

    On the CPU: eager mode (vLLM's CPU torch.compile spends minutes in the C++ compiler on two
    cores) and a fixed KV budget. On a GPU: vLLM's defaults, CUDA graphs included, with a
    modest memory share so that a reference model can sit beside the engine (or, with
    ``VLLM_WEDLM_SHARED_GPU=1``, the CPU's fixed KV budget, so that several processes share it).
    """
    # The caller has usually done torch work already (made a checkpoint, ran a reference model),
    # which starts torch's CPU thread pools; a forked engine process can deadlock in them.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    kwargs: dict[str, Any] = {"max_model_len": 512, "seed": 0}
    if on_gpu():
        kwargs.update(_gpu_memory(), **_exact_attention(overrides.get("dtype")))
    else:
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
    kwargs.update(overrides)
    return kwargs


def serve_args(dtype: str | None = None) -> list[str]:
    """The same settings as ``vllm serve`` flags, for a server of ``dtype`` (its ``--dtype``)."""
    if on_gpu():
        return ["--max-model-len", "512", *serve_flags({**_gpu_memory(), **_exact_attention(dtype)})]
    return ["--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]


def serve_flags(settings: dict[str, Any]) -> list[str]:
    """``vllm.LLM`` keyword arguments as ``vllm serve`` flags (``--kv-cache-memory-bytes=...``)."""
    return [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]


def _exact_attention(dtype: str | None) -> dict[str, Any]:
    """On CUDA, the attention backend of a float32 engine whose results are compared exactly.

    vLLM's default float32 attention on CUDA (TRITON_ATTN) multiplies in TF32 (Triton's tl.dot
    default), 1e-3 off in log-probs; FlexAttention follows torch's float32 precision ("highest" in
    vLLM workers), so float32 parity checks stay exact.
    """
    return {"attention_backend": "FLEX_ATTENTION"} if dtype == "float32" else {}


def shared_gpu_memory() -> dict[str, Any]:
    """Engine memory settings where several processes share one GPU (``SHARED_GPU_ENV``), else none."""
    if os.environ.get(SHARED_GPU_ENV) == "1":
        return {"gpu_memory_utilization": 0.04, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {}


def _gpu_memory() -> dict[str, Any]:
    return shared_gpu_memory() or {"gpu_memory_utilization": 0.3}
