"""The ``vllm.general_plugins`` entry point: discovered by vLLM, registers everything, lazily."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (a clean registry, as in each vLLM process); it prints JSON."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_entry_point_is_declared():
    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "wedlm"]
    assert ep.value == "vllm_wedlm:register"
    import vllm_wedlm

    assert ep.load() is vllm_wedlm.register


def test_vllm_discovers_and_registers_everything():
    result = run_python("""
import json, sys
import torch
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM's own discovery, as every engine process runs it
from transformers import AutoConfig
from vllm import ModelRegistry
from vllm.transformers_utils.config import _CONFIG_REGISTRY
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
from vllm.engine.arg_utils import EngineArgs
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
print(json.dumps({
    "arch": "WeDLMForCausalLM" in ModelRegistry.get_supported_archs(),
    "auto_config": AutoConfig.for_model("wedlm").__class__ is WeDLMConfig,
    "vllm_config_registry": _CONFIG_REGISTRY["wedlm"] is WeDLMConfig,
    "config_hook": MODELS_CONFIG_MAP["WeDLMForCausalLM"].__name__,
    "cli_flag": getattr(EngineArgs.add_cli_args, "_vllm_wedlm_wrapped", False),
    # Lazy: the model module (vLLM's model code) is not imported, CUDA never touched.
    "model_module_loaded": "vllm_wedlm.models.wedlm" in sys.modules,
    "cuda_initialized": torch.cuda.is_initialized(),
}))
""")
    assert result == {
        "arch": True,
        "auto_config": True,
        "vllm_config_registry": True,
        "config_hook": "WeDLMConfigHook",
        "cli_flag": True,
        "model_module_loaded": False,
        "cuda_initialized": False,
    }


def test_registration_is_idempotent():
    result = run_python("""
import json
import vllm_wedlm
from vllm.engine.arg_utils import EngineArgs
vllm_wedlm.register()
add, from_cli = EngineArgs.add_cli_args, EngineArgs.from_cli_args
import vllm_wedlm.plugin as plugin
plugin._done = False  # force the whole registration to run again, as in a re-imported process
vllm_wedlm.register()
import argparse
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())  # a second --decoding would raise here
print(json.dumps({"same_add": EngineArgs.add_cli_args is add,
                  "decoding_flags": sum("--decoding" in a.option_strings for a in parser._actions)}))
""")
    assert result == {"same_add": True, "decoding_flags": 1}


def test_importing_the_package_registers_with_transformers_and_touches_no_vllm():
    """``import vllm_wedlm`` makes WeDLM checkpoints load in plain transformers (models/auto.py;
    test_config.py loads one) and does nothing else: no vLLM, no CUDA. It does import torch,
    because transformers' config machinery imports it."""
    result = run_python("""
import json, sys
import vllm_wedlm
import torch
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
print(json.dumps({
    "vllm_imported": any(m == "vllm" or m.startswith("vllm.") for m in sys.modules),
    "cuda_initialized": torch.cuda.is_initialized(),
    "auto_config": type(AutoConfig.for_model("wedlm")) is WeDLMConfig,
    "causal_lm": MODEL_FOR_CAUSAL_LM_MAPPING[WeDLMConfig].__name__,
}))
""")
    assert result == {"vllm_imported": False, "cuda_initialized": False, "auto_config": True,
                      "causal_lm": "WeDLMAsQwenForCausalLM"}


def test_gpu_worker_leaves_torch_cuda_alone():
    # vLLM's CPU worker modules replace torch.cuda.Event/Stream with no-ops when imported; a GPU
    # engine that imported them lost torch.compile's autotuning. The GPU worker must not.
    result = run_python("""
import json, torch
originals = (torch.Event, torch.cuda.Event, torch.cuda.Stream)
import vllm_wedlm.adapter.gpu_worker
print(json.dumps((torch.Event, torch.cuda.Event, torch.cuda.Stream) == originals))
""")
    assert result is True
