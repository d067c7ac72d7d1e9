"""The WeDLM worker for CUDA: vLLM's GPU worker with the WeDLM runner.

Kept apart from the CPU worker on purpose: importing vLLM's CPU worker replaces
``torch.cuda.Event`` and ``torch.cuda.Stream`` process-wide with no-op placeholders, which
breaks torch.compile's autotuning (and anything else timing CUDA events) in a GPU process.
"""

from __future__ import annotations

from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from vllm_wedlm.adapter.model_runner import WeDLMRunnerMixin, WeDLMWorkerMixin


class WeDLMGPUModelRunner(WeDLMRunnerMixin, GPUModelRunner):
    pass


class WeDLMGPUWorker(WeDLMWorkerMixin, Worker):
    def init_device(self) -> None:
        super().init_device()
        # The stock runner holds no model yet (weights load later); replace it before that.
        self.model_runner = WeDLMGPUModelRunner(self.vllm_config, self.device)
