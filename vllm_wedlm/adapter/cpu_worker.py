"""The WeDLM worker for the CPU: vLLM's CPU worker with the WeDLM runner.

Only a CPU engine may import this module (see gpu_worker.py for why).
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_wedlm.adapter.model_runner import WeDLMRunnerMixin, WeDLMWorkerMixin
from vllm_wedlm.adapter.vllm_contract import check_vllm_contract

# Where vLLM loads the adapter's runner (each worker, as the engine starts): a vLLM whose
# internals differ from the pinned one's fails here, naming each difference, not mid-request.
check_vllm_contract()


class WeDLMCPUModelRunner(WeDLMRunnerMixin, CPUModelRunner):
    pass


class WeDLMCPUWorker(WeDLMWorkerMixin, CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        # The stock runner holds no model yet (weights load later); replace it before that.
        self.model_runner = WeDLMCPUModelRunner(self.vllm_config, torch.device("cpu"))
