#!/usr/bin/env bash
# Build the GPU kit of one vLLM version: torch, triton, NCCL and vLLM (trimmed to what a dense bf16
# model on Hopper loads) and the Python packages they need that the GPU machine lacks
# (requirements-vllm0YY-cp312.txt), unpacked into one site tree, compressed with xz and split into
# parts that each fit one device call with the working tree (64 MiB in all). README.md beside this
# says how to send them and what the machine's own CUDA libraries stand in for.
#
# Usage (from the project's root):  bash scripts/gpukit/build.sh 0.34.0     (or 0.33.0)
# Output: .gpukit034/p01 ... (git-ignored via .git/info/exclude); the kit itself is cached.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
source "$here/kit.sh" "${1:-${VLLM_VERSION:-}}"
VLLM_VERSION="$kit_version"
part_mb="${GPUKIT_PART_MB:-50}"  # the working tree travels beside each part (about 11 MiB now)
mkdir -p "$kit_cache/wheels"
grep -qx "/$kit_parts/" "$root/.git/info/exclude" 2>/dev/null || echo "/$kit_parts/" >> "$root/.git/info/exclude"

# The kit's name carries a hash of what decides its contents: rebuilt when they change.
key="$(cat "$kit_requirements" "$here/build.sh" | sha256sum | cut -c1-12)"
kit="$kit_cache/kit-$key.tar.xz"
if [ ! -f "$kit" ]; then
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$kit_cache/wheels" "vllm==$VLLM_VERSION" \
    -r "$kit_requirements"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip install -q --no-deps --no-index --no-compile "${plat[@]}" --find-links "$kit_cache/wheels" \
    --target "$work/site" "vllm==$VLLM_VERSION" -r "$kit_requirements"
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

out="$root/$kit_parts"
rm -rf "$out" && mkdir -p "$out"
(cd "$out" && split -b "${part_mb}M" -d -a 2 "$kit" kit.txz.)
n=0
for chunk in "$out"/kit.txz.*; do
  n=$((n + 1))
  part="$out/p$(printf %02d "$n")"
  mkdir -p "$part" && mv "$chunk" "$part/"
done
cp "$here/stage.sh" "$here/install.sh" "$here/env.sh" "$out/p01/"
# What the GPU side's scripts read: this version's folders there.
printf 'KIT_VLLM=%s\nKIT_PARTS=%s\nKIT_DIR=%s\nKIT_SITE=%s\n' "$VLLM_VERSION" "$kit_parts" "$kit_gpu_dir" \
  "$kit_gpu_site" > "$out/p01/kit.env"
du -sh "$out"/p* | sed "s|$root/||" | tr '\n' ' '; echo
echo "kit ready: $n parts, $(du -sh "$kit" | cut -f1) ($kit); the device calls, back to back (README.md):"
echo "  carry [\"$kit_parts/p01\"]: bash $kit_parts/p01/stage.sh p01"
for i in $(seq 2 "$n"); do
  p="p$(printf %02d "$i")"
  echo "  carry [\"$kit_parts/$p\"]: bash $kit_gpu_dir/stage.sh $p"
done
echo "  then: bash $kit_gpu_dir/install.sh && source $kit_gpu_dir/env.sh && YOUR COMMAND"
