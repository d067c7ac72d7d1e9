#!/usr/bin/env bash
# The CUTLASS DSL (nvidia-cutlass-dsl 4.8.0 with its CUDA 13 libraries) and QuACK (quack-kernels
# 0.6.5, which vLLM 0.34.0 pins) as extra parts of the vLLM 0.34.0 kit. resolve.py leaves both out (no
# dense bf16 kernel uses them), but vLLM 0.34.0's warm-up imports them on every CUDA machine
# (model_executor/warmup/kernel_warmup.py: the MiniMax-M3 MSA warm-up's module imports `cutlass` and
# `quack` before it checks the model), so without them no engine starts.
#
#   bash scripts/gpukit/cutlass_addon.sh        # writes .gpukit034/p20, p21 (addon.txz.NN), cached
#
# install.sh unpacks addon.txz.* into the site folder; env.sh puts its dsl_packages on PYTHONPATH
# (what the wheel's .pth file does in a site-packages folder, which PYTHONPATH folders are not).
# Their other requirements are the kit's (apache-tvm-ffi) or the machine's own copies (cuda-bindings,
# protobuf, typing-extensions, einops).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
source scripts/gpukit/kit.sh 0.34.0
version=4.8.0
cache="$kit_cache/cutlass-dsl-$version-quack-0.6.5"
if [ ! -f "$cache/addon.txz" ]; then
  mkdir -p "$cache/wheels" && rm -rf "$cache/site" && mkdir "$cache/site"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$cache/wheels" \
    "nvidia-cutlass-dsl==$version" "nvidia-cutlass-dsl-libs-base==$version" \
    "nvidia-cutlass-dsl-libs-core==$version" "nvidia-cutlass-dsl-libs-cu13==$version" "quack-kernels==0.6.5"
  for wheel in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$cache/site"; done
  tar -cf - -C "$cache/site" . | xz -6 -T0 > "$cache/addon.txz.tmp" && mv "$cache/addon.txz.tmp" "$cache/addon.txz"
  rm -rf "$cache/site"
fi
first=$(( $(ls "$kit_parts"/p*/kit.txz.* | wc -l) + 1 ))  # after the kit's own parts
split -b 50M -d -a 2 "$cache/addon.txz" "$cache/addon.txz."
n=$first
for chunk in "$cache"/addon.txz.[0-9][0-9]; do
  part="$kit_parts/p$(printf %02d "$n")"
  rm -rf "$part" && mkdir -p "$part" && mv "$chunk" "$part/"
  echo "  carry [\"$part\"]: bash $kit_gpu_dir/stage.sh p$(printf %02d "$n")"
  n=$((n + 1))
done
