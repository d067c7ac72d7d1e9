#!/usr/bin/env bash
# Before a GPU session, on the CPU machine: unpack the built kit (.gpukit033) and import vLLM 0.33.0
# from it with Python 3.12, the GPU machine's own packages at its versions beside it
# (machine-reused-cp312.txt, its CUDA 13 libraries included), as env.sh arranges there. It catches a
# missing package or a CUDA library torch cannot load, at no GPU time. It cannot load what needs the
# driver (libcuda.so.1): vLLM's own CUDA kernels, and anything that touches a GPU.
#
# Usage (from the project's root, after build.sh):  bash scripts/gpukit033/check_imports.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
work="${GPUKIT033_CHECK_DIR:-/tmp/gpukit033-check}"
py="${PYTHON312:-$(command -v python3.12 >/dev/null && python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null \
      || ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}"
[ -x "$py" ] || { echo "no Python 3.12 here (set PYTHON312)"; exit 2; }
source "$here/platforms.sh"
if [ ! -d "$work/machine/nvidia" ]; then
  python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$work/machine" \
    -r "$here/machine-reused-cp312.txt"
fi
rm -rf "$work/site33" && mkdir -p "$work/site33"
cat "$root"/.gpukit033/p*/kit.txz.* | xz -d -T0 | tar -xf - -C "$work/site33"
cd "$work"
PYTHONPATH="$work/site33:$work/machine" PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 VLLM_PLUGINS= "$py" - <<'PY'
import torch
import triton
from torch.cuda import nccl

print("torch", torch.__version__, "| triton", triton.__version__, "| nccl", ".".join(map(str, nccl.version())),
      "| cudnn", torch.backends.cudnn.version())
import vllm
from vllm import LLM, SamplingParams  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
import vllm.model_executor.models.qwen3  # noqa: F401
import vllm.v1.engine.core  # noqa: F401
import vllm.v1.worker.gpu.model_runner  # noqa: F401
import vllm.v1.worker.gpu_model_runner  # noqa: F401

print("vllm", vllm.__version__, "imports: ok")
PY
