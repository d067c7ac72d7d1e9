# Sourced by build.sh and check_imports.sh: the names of one vLLM version's kit.
#
#   source scripts/gpukit/kit.sh VLLM_VERSION      # 0.33.0 or 0.34.0
#
# A version X.Y.0 has its requirements beside this file (requirements-vllm0YY-cp312.txt and
# machine-reused-vllm0YY-cp312.txt, written by resolve.py). Its parts go to .gpukit0YY/ here (git-ignored),
# to /tmp/kitYY and unpacked into /tmp/siteYY on the GPU machine (kit.env, written into part p01, says so).
kit_version="${1:?usage: VLLM_VERSION (0.33.0, 0.34.0)}"
kit_minor="$(echo "$kit_version" | cut -d. -f2)"
kit_tag="0$kit_minor"  # 0.34.0 -> 034
kit_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kit_requirements="$kit_here/requirements-vllm$kit_tag-cp312.txt"
kit_reused="$kit_here/machine-reused-vllm$kit_tag-cp312.txt"
kit_parts=".gpukit$kit_tag"        # in the project's root, here and on the GPU machine
kit_gpu_dir="/tmp/kit$kit_minor"   # the GPU machine's staging folder
kit_gpu_site="/tmp/site$kit_minor" # where install.sh unpacks it there
kit_cache="${GPUKIT_CACHE:-$HOME/.cache/gpukit-vllm$kit_tag}"
[ -f "$kit_requirements" ] || { echo "no kit for vLLM $kit_version: $kit_requirements is missing (resolve.py writes it)"; exit 2; }
source "$kit_here/platforms.sh"
