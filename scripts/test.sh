#!/usr/bin/env bash
# Set up the CPU environment and the test tools if needed (scripts/setup-tests.sh), lint (ruff.toml),
# then run the whole test suite on the real vLLM engine. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -k parity`, or `bash scripts/test.sh -m fast` for the fast tier).
# Without arguments, the V2 binding's step tests follow on vLLM 0.34, in their own environment
# (tests/v034, .venv034 from scripts/setup-vllm034.sh; run them alone with
# `.venv034/bin/python -m pytest tests/v034`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-tests.sh"
cd "$root"
python="${VLLM_WEDLM_VENV:-$root/.venv}/bin/python"
"$python" -m ruff check --no-cache .  # seconds; a finding fails the run before the slow tests start
if [ "$#" -gt 0 ]; then
  exec "$python" -m pytest tests "$@"
fi
"$python" -m pytest tests
bash "$root/scripts/setup-vllm034.sh"
exec "${VLLM_WEDLM_VENV034:-$root/.venv034}/bin/python" -m pytest tests/v034
