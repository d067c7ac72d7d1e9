#!/usr/bin/env bash
# Set up the CPU environment if needed, then run the whole test suite on the real vLLM engine.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k parity`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "${VLLM_WEDLM_VENV:-$root/.venv}/bin/python" -m pytest tests "$@"
