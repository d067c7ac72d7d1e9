# On the GPU machine: `source /tmp/kit34/env.sh` (0.34.0; /tmp/kit33 for 0.33.0) before anything that
# imports the kit's vLLM. kit.env beside it names the version's folders.
source "$(dirname "${BASH_SOURCE[0]}")/kit.env"
export PYTHONPATH="$KIT_SITE"   # first on sys.path: torch 2.14 and its NCCL before the machine's
export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1  # the machine's cuDNN 9.19 for torch's 9.24 (no cuDNN kernel runs)
export VLLM_USE_FLASHINFER_SAMPLER=0  # FlashInfer is not in the kit
export VLLM_PLUGINS=                  # stock vLLM: no plugin (the project is not installed either)
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The CUTLASS DSL add-on (cutlass_addon.sh): its wheel's .pth adds dsl_packages, which a PYTHONPATH folder does not read.
[ -d "$KIT_SITE/nvidia_cutlass_dsl/dsl_packages" ] && export PYTHONPATH="$PYTHONPATH:$KIT_SITE/nvidia_cutlass_dsl/dsl_packages"
