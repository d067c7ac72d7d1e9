"""WeDLM's commits in vLLM's Prometheus metrics (``/metrics`` of ``vllm serve``).

vLLM already names the counters a diffusion decoder needs; a WeDLM engine fills them:

* ``vllm:diffusion_num_denoising_steps_total``: request-forwards (one request's window in one step);
* ``vllm:diffusion_num_canvas_positions_total``: window slots forwarded;
* ``vllm:diffusion_num_committed_tokens_total``: tokens committed.

Tokens per forward over an interval is then
``rate(vllm:diffusion_num_committed_tokens_total[1m]) / rate(vllm:diffusion_num_denoising_steps_total[1m])``.

The numbers travel from the engine's scheduler in ``SchedulerStats.spec_decoding_stats`` (the
field vLLM's own diffusion path uses); vLLM only turns them into diffusion counters for models
whose config has a ``canvas_length``, so this subclass, registered as a
``vllm.stat_logger_plugins`` entry point, does it for WeDLM engines. In AR mode it is vLLM's
Prometheus logger, unchanged.
"""

from __future__ import annotations

from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.spec_decode.metrics import SpecDecodingProm

from vllm_wedlm.config import WeDLMSettings


class WeDLMPrometheusStatLogger(PrometheusStatLogger):
    def __init__(self, vllm_config, engine_indexes=None):
        self.wedlm = WeDLMSettings.from_additional_config(vllm_config.additional_config).wedlm
        super().__init__(vllm_config, engine_indexes)

    def _spec_decoding_cls(self, speculative_config, labelnames, per_engine_labelvalues, is_diffusion=False):
        return SpecDecodingProm(speculative_config, labelnames, per_engine_labelvalues,
                                is_diffusion=is_diffusion or self.wedlm)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        super().record(scheduler_stats, iteration_stats, mm_cache_stats=mm_cache_stats, engine_idx=engine_idx)
        if self.wedlm and scheduler_stats is not None:
            # Consumed here. vLLM's log-line logger (which runs after the plugin loggers) would
            # otherwise report them as draft acceptance ("Mean acceptance length" = 1 + tokens
            # per forward, counting a bonus token WeDLM never samples); the engine logs its own
            # "WeDLM decoding: ... tokens per forward" line instead.
            scheduler_stats.spec_decoding_stats = None
