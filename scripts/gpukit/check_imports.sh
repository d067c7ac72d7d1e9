#!/usr/bin/env bash
# Before a GPU session, on the CPU machine: unpack the built kit (.gpukit034 for 0.34.0) and import its
# vLLM from it with Python 3.12, the GPU machine's own packages at its versions beside it
# (machine-reused-vllm0YY-cp312.txt, its CUDA 13 libraries included), as env.sh arranges there. It catches
# a missing package, a package whose requirements the others break, or a CUDA library torch cannot load,
# at no GPU time. It cannot load what needs the driver (libcuda.so.1): vLLM's own CUDA kernels, and
# anything that touches a GPU. For 0.34 it also imports the project's V2 binding and checks
# v034_spike.py's imports and arguments (the project from this tree, as on the GPU machine).
#
# Usage (from the project's root, after build.sh):  bash scripts/gpukit/check_imports.sh 0.34.0
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
source "$here/kit.sh" "${1:-${VLLM_VERSION:-}}"
work="${GPUKIT_CHECK_DIR:-/tmp/gpukit$kit_tag-check}"
py="${PYTHON312:-$(command -v python3.12 >/dev/null && python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null \
      || ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}"
[ -x "$py" ] || { echo "no Python 3.12 here (set PYTHON312)"; exit 2; }
if [ ! -d "$work/machine/nvidia" ]; then
  python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$work/machine" -r "$kit_reused"
fi
rm -rf "$work/site" && mkdir -p "$work/site"
cat "$root/$kit_parts"/p*/kit.txz.* | xz -d -T0 | tar -xf - -C "$work/site"
if ls "$root/$kit_parts"/p*/addon.txz.* >/dev/null 2>&1; then  # cutlass_addon.sh
  cat "$root/$kit_parts"/p*/addon.txz.* | xz -d -T0 | tar -xf - -C "$work/site"
fi
cd "$work"
export PYTHONPATH="$work/site:$work/machine" PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 VLLM_PLUGINS=
[ -d "$work/site/nvidia_cutlass_dsl/dsl_packages" ] && PYTHONPATH="$PYTHONPATH:$work/site/nvidia_cutlass_dsl/dsl_packages"
"$py" - "$kit_version" "$work/site" "$work/machine" "$root" <<'PY'
import importlib
import sys
from importlib.metadata import distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

version, site, machine, root = sys.argv[1:]
# Every package's requirements on the others, met (torch's pins of the CUDA libraries the machine's
# older copies stand in for excepted: README.md; packages the kit leaves out are not looked for).
present = {}
for dist in distributions(path=[site, machine]):  # the kit's copy first, as on sys.path
    present.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
unmet = []
for name, dist in sorted(present.items()):
    for requirement in map(Requirement, dist.requires or []):
        other = present.get(canonicalize_name(requirement.name))
        if other is None or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        if other.version not in requirement.specifier and not (name == "torch" and requirement.name.startswith(
                ("nvidia-", "cuda-"))):
            unmet.append(f"{name} {dist.version} wants {requirement}, has {other.version}")
print(f"{len(present)} packages; requirements unmet: {unmet or 'none'}")

import torch
import triton
from torch.cuda import nccl

print("torch", torch.__version__, "| triton", triton.__version__, "| nccl", ".".join(map(str, nccl.version())),
      "| cudnn", torch.backends.cudnn.version())
import vllm
from vllm import LLM, SamplingParams  # noqa: F401

modules = ["vllm.entrypoints.openai.api_server", "vllm.model_executor.models.qwen3", "vllm.v1.engine.core",
           "vllm.v1.worker.gpu.model_runner"]
if version.startswith("0.33."):
    modules += ["vllm.v1.worker.gpu_model_runner"]
else:  # what the V2 binding and v034_spike.py load on the GPU (FA3 for bf16, FlexAttention for float32)
    sys.path.insert(0, root)
    modules += ["vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.flex_attention",
                "vllm.v1.core.sched.diffusion_scheduler", "vllm.v1.worker.gpu.model_states.default",
                "vllm_wedlm.v2.model", "vllm_wedlm.v2.model_state", "vllm_wedlm.v2.registration",
                "vllm_wedlm.v2.scheduler", "vllm_wedlm.reference.decoder", "benchmarks.step_cost",
                # the kernel warm-up imports it on every CUDA machine (cutlass, quack: cutlass_addon.sh)
                "vllm.model_executor.warmup.minimax_m3_msa_warmup"]
for module in modules:
    importlib.import_module(module)
print("vllm", vllm.__version__, "imports:", ", ".join(modules), ": ok")
sys.exit(1 if unmet else 0)
PY
if [ "$kit_minor" -ge 34 ]; then
  for part in exact shape; do
    "$py" "$root/scripts/gpukit/v034_spike.py" "$part" --check --json /dev/null 2>&1 | tail -1
  done
fi
