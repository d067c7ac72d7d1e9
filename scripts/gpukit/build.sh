#!/usr/bin/env bash
# Build the vLLM 0.33.0 GPU kit: torch 2.14.0, triton 3.8.0, NCCL 2.30.7, vLLM 0.33.0 (trimmed to what
# a dense bf16 model on Hopper loads) and the Python packages they need that the GPU machine lacks
# (requirements-cp312.txt), unpacked into one site tree, compressed with xz and split into parts that
# each fit one device call with the working tree (64 MiB in all). README.md beside this says how to
# send them and what the machine's own CUDA libraries stand in for.
#
# Usage (from the project's root):  bash scripts/gpukit033/build.sh
# Output: .gpukit033/p01 ... (git-ignored via .git/info/exclude); the kit itself is cached.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
cache="${GPUKIT033_CACHE:-$HOME/.cache/gpukit-vllm033}"
part_mb="${GPUKIT033_PART_MB:-50}"  # the working tree travels beside each part (about 11 MiB now)
VLLM_VERSION=0.33.0
mkdir -p "$cache/wheels"
grep -qx '/.gpukit033/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpukit033/' >> "$root/.git/info/exclude"

source "$here/platforms.sh"

# The kit's name carries a hash of what decides its contents: rebuilt when they change.
key="$(cat "$here/requirements-cp312.txt" "$here/build.sh" | sha256sum | cut -c1-12)"
kit="$cache/kit-$key.tar.xz"
if [ ! -f "$kit" ]; then
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$cache/wheels" "vllm==$VLLM_VERSION" \
    -r "$here/requirements-cp312.txt"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip install -q --no-deps --no-index --no-compile "${plat[@]}" --find-links "$cache/wheels" \
    --target "$work/site" "vllm==$VLLM_VERSION" -r "$here/requirements-cp312.txt"
  v="$work/site/vllm"
  # What a dense bf16 model on Hopper does not load (all imported optionally by vLLM, as in the
  # 0.26 kit): FlashAttention 2 (FA3 serves sm90), the MoE, FlashMLA and FP4 kernels, DeepGEMM's JIT
  # headers and other Pythons' builds, the SM100 FMHA sources, the Rust frontend. pip's RECORD
  # would list the removed files.
  rm -f "$v"/vllm_flash_attn/_vllm_fa2_C.abi3.so "$v"/_moe_C_stable_libtorch.abi3.so "$v"/_flashmla_C.abi3.so \
        "$v"/_flashmla_extension_C.abi3.so "$v"/_qutlass_C.abi3.so "$v"/vllm-rs \
        "$work"/site/vllm-$VLLM_VERSION.dist-info/RECORD
  rm -rf "$v"/third_party/deep_gemm/include "$v"/third_party/fmha_sm100
  find "$v"/third_party/deep_gemm -name '_C.cpython-3*' ! -name '*cpython-312*' -delete
  find "$work/site" -name '__pycache__' -prune -exec rm -rf {} +
  du -sh "$work/site"
  (cd "$work/site" && tar -cf - .) | xz -6 -T0 > "$kit.tmp"
  mv "$kit.tmp" "$kit"
fi

rm -rf "$root/.gpukit033" && mkdir -p "$root/.gpukit033"
(cd "$root/.gpukit033" && split -b "${part_mb}M" -d -a 2 "$kit" kit.txz.)
n=0
for chunk in "$root"/.gpukit033/kit.txz.*; do
  n=$((n + 1))
  part="$root/.gpukit033/p$(printf %02d "$n")"
  mkdir -p "$part" && mv "$chunk" "$part/"
done
cp "$here/stage.sh" "$here/install.sh" "$here/env.sh" "$root/.gpukit033/p01/"
du -sh "$root"/.gpukit033/p* | sed "s|$root/||" | tr '\n' ' '; echo
echo "kit ready: $n parts, $(du -sh "$kit" | cut -f1) ($kit); see scripts/gpukit033/README.md for the device calls"
