#!/usr/bin/env bash
# Set up the CPU environment if needed, then run the main job on its embedded default: a tiny
# WeDLM checkpoint made locally, generated with vllm.LLM. Extra arguments go to the example.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${VLLM_WEDLM_VENV:-$root/.venv}/bin/python" examples/generate.py "$@"
