"""Workers that build the WeDLM runner: vLLM's CPU and GPU workers, runner swapped after init."""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker


class WeDLMGPUWorker(Worker):
    def init_device(self):
        super().init_device()
        from vllm_wedlm.adapter.model_runner import WeDLMGPUModelRunner

        # The stock runner holds no model yet (weights load later); replace it before that.
        self.model_runner = WeDLMGPUModelRunner(self.vllm_config, self.device)


class WeDLMCPUWorker(CPUWorker):
    def init_device(self):
        super().init_device()
        import torch

        from vllm_wedlm.adapter.model_runner import WeDLMCPUModelRunner

        self.model_runner = WeDLMCPUModelRunner(self.vllm_config, torch.device("cpu"))
