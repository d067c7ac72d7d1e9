#!/usr/bin/env bash
# Set up .venv034, the vLLM 0.34 environment of the CPU step harness (tests/v034/, issue 70), beside
# .venv (vLLM 0.26; scripts/setup.sh). Idempotent: a stamp skips it when nothing changed.
#
#   1. torch 2.14.1 (the CUDA 13 build: it runs without a GPU). vLLM 0.34.0 pins torch==2.14.0, but
#      this machine's pip is capped at torch<=2.14.1, which lies on its local disk; the skew is a
#      patch release and the harness imports only Python modules of vLLM;
#   2. vLLM 0.34.0's runtime requirements without the GPU-only kernels and media packages, and
#      pytest, pinned in requirements/vllm-0.34.0-cpu.txt;
#   3. vllm 0.34.0 without dependencies (no CPU build of 0.34 exists; the CUDA wheel's Python modules
#      and vLLM's Triton kernels, run by Triton's interpreter, are what the harness uses);
#   4. this package, editable, without dependencies.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${VLLM_WEDLM_VENV034:-$root/.venv034}"
python="${PYTHON:-python3}"
stamp="$venv/.vllm_wedlm_setup"

want="$(cat scripts/setup-vllm034.sh setup.py requirements/vllm-0.34.0-cpu.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up $venv (first run: about two minutes)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" torch==2.14.1
  "${pip[@]}" -r requirements/vllm-0.34.0-cpu.txt
  "${pip[@]}" --no-deps vllm==0.34.0
  "${pip[@]}" --no-deps --no-build-isolation -e .
  "$venv/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
  echo "$want" > "$stamp"
fi
