"""tests/v034 run in .venv034 (vLLM 0.34, scripts/setup-vllm034.sh), never under vLLM 0.26 (tests/conftest.py).

vLLM 0.34 has no CPU build, and its V2 runner prepares inputs with Triton kernels. Here they run
through Triton's interpreter on CPU tensors: TRITON_INTERPRET=1; CUDA_VISIBLE_DEVICES="" keeps
vLLM's Triton import on (``vllm/triton_utils/importing.py``); VLLM_TARGET_DEVICE=cpu picks the CPU
platform, and ``vllm.v1.worker.cpu.shm`` applies vLLM's own patches of the V2 buffers for CPUs.
VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps an engine's core in this process, where cpu_engine.py
installs what vLLM's missing CPU extension would provide. They must be set before vLLM or Triton
is imported, so tests/conftest.py (which pytest loads first) sets them, before its own imports.
"""

import vllm.v1.worker.cpu.shm  # noqa: F401
