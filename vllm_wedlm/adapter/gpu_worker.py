"""The WeDLM worker for CUDA: vLLM's GPU worker with the WeDLM runner.

Kept apart from the CPU worker on purpose: importing vLLM's CPU worker replaces
``torch.cuda.Event`` and ``torch.cuda.Stream`` process-wide with no-op placeholders, which
breaks torch.compile's autotuning (and anything else timing CUDA events) in a GPU process.
"""

from __future__ import annotations

from vllm.config import CompilationMode
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from vllm_wedlm.adapter.model_runner import WeDLMRunnerMixin, WeDLMWorkerMixin
from vllm_wedlm.adapter.vllm_contract import check_vllm_contract

# Where vLLM loads the adapter's runner (each worker, as the engine starts): a vLLM whose
# internals differ from the pinned one's fails here, naming each difference, not mid-request.
check_vllm_contract()


class WeDLMGPUModelRunner(WeDLMRunnerMixin, GPUModelRunner):
    pass


class WeDLMGPUWorker(WeDLMWorkerMixin, Worker):
    def init_device(self) -> None:
        super().init_device()
        # The stock runner holds no model yet (weights load later); replace it before that.
        self.model_runner = WeDLMGPUModelRunner(self.vllm_config, self.device)

    def compile_or_warm_up_model(self):
        times = super().compile_or_warm_up_model()
        # The step of plain windows is compiled when the model is (not with --enforce-eager).
        if self.vllm_config.compilation_config.mode == CompilationMode.VLLM_COMPILE:
            self.model_runner.wedlm_compile_window_step()
        return times
