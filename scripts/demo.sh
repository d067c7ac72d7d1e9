#!/usr/bin/env bash
# Set up the CPU environment if needed, then run the main job on its embedded default: the trained
# micro WeDLM model shipped in the package, answering held-out prompts with --decoding ar and
# --decoding wedlm side by side (vllm.LLM). Extra arguments go to examples/generate.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${VLLM_WEDLM_VENV:-$root/.venv}/bin/python" examples/generate.py "$@"
