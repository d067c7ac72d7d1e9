#!/usr/bin/env bash
# On the GPU machine, after every part is staged: unpack the kit into /tmp/site33 (once per machine)
# and check what it brought. The project is not installed: vLLM 0.33.0 runs stock here.
set -e
if [ ! -d /tmp/site33/vllm ]; then
  parts=$(ls /tmp/kit33/kit.txz.* | wc -l)
  mkdir -p /tmp/site33
  cat /tmp/kit33/kit.txz.* | xz -d -T0 | tar -xf - -C /tmp/site33
  echo "unpacked $parts parts into /tmp/site33 ($(du -sh /tmp/site33 | cut -f1))"
fi
source /tmp/kit33/env.sh
python3 - <<'PY'
import torch, triton, vllm
from torch.cuda import nccl
print("vllm", vllm.__version__, "| torch", torch.__version__, "| triton", triton.__version__,
      "| nccl", ".".join(map(str, nccl.version())), "| cudnn", torch.backends.cudnn.version(),
      "|", torch.cuda.get_device_name(0))
PY
