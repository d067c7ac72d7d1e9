#!/usr/bin/env bash
# On the GPU machine, after every part is staged: unpack the kit into its site folder (/tmp/site34
# for 0.34.0; once per machine) and check what it brought. The project is not installed: vLLM runs
# stock here (a script of the project may import the project from the tree, as v034_spike.py does).
set -e
source "$(dirname "${BASH_SOURCE[0]}")/kit.env"
if [ ! -d "$KIT_SITE/vllm" ]; then
  parts=$(ls "$KIT_DIR"/kit.txz.* | wc -l)
  mkdir -p "$KIT_SITE"
  cat "$KIT_DIR"/kit.txz.* | xz -d -T0 | tar -xf - -C "$KIT_SITE"
  echo "unpacked $parts parts into $KIT_SITE ($(du -sh "$KIT_SITE" | cut -f1))"
fi
if ls "$KIT_DIR"/addon.txz.* >/dev/null 2>&1 && [ ! -d "$KIT_SITE/nvidia_cutlass_dsl" ]; then
  cat "$KIT_DIR"/addon.txz.* | xz -d -T0 | tar -xf - -C "$KIT_SITE"  # cutlass_addon.sh
  echo "unpacked the CUTLASS DSL add-on into $KIT_SITE"
fi
source "$KIT_DIR/env.sh"
python3 - <<'PY'
import torch, triton, vllm
from torch.cuda import nccl
print("vllm", vllm.__version__, "| torch", torch.__version__, "| triton", triton.__version__,
      "| nccl", ".".join(map(str, nccl.version())), "| cudnn", torch.backends.cudnn.version(),
      "|", torch.cuda.get_device_name(0))
PY
