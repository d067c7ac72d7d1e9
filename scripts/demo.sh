#!/usr/bin/env bash
# Set up what the demo needs if needed (scripts/setup.sh), then run the main job on its embedded
# default: the trained micro WeDLM model shipped in the package, answering held-out word problems with
# --decoding ar and --decoding wedlm side by side (vllm.LLM). The engines' log lines go to
# .cache/demo.log; the terminal shows a progress line, then the table. Extra arguments go to
# examples/generate.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${VLLM_WEDLM_VENV:-$root/.venv}/bin/python" examples/generate.py --log-file "$root/.cache/demo.log" "$@"
