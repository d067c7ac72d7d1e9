"""WeDLM's commits in vLLM's Prometheus metrics (``/metrics`` of ``vllm serve``), in WeDLM mode only.

vLLM already names the counters a diffusion decoder needs; a WeDLM engine fills them:

* ``vllm:diffusion_num_denoising_steps_total``: request-forwards (one request's window in one step, or
  its forward in an adaptive window's AR step, W 0);
* ``vllm:diffusion_num_canvas_positions_total``: window slots forwarded;
* ``vllm:diffusion_num_committed_tokens_total``: tokens committed.

Tokens per forward over an interval is then
``rate(vllm:diffusion_num_committed_tokens_total[1m]) / rate(vllm:diffusion_num_denoising_steps_total[1m])``.

The numbers travel from the engine's scheduler in ``SchedulerStats.spec_decoding_stats`` (the
field vLLM's own diffusion path uses); vLLM only turns them into diffusion counters for models
whose config has a ``canvas_length``, so :class:`WeDLMPrometheusStatLogger`, vLLM's Prometheus
logger with those counters switched on, does it for WeDLM engines.

Why it is not a ``vllm.stat_logger_plugins`` entry point: vLLM 0.26.0's ``AsyncLLM`` loads that
group for every engine on the machine, turns statistics on for every engine when the group is not
empty (``--disable-log-stats`` then no longer disables them) and lets a Prometheus logger found
there replace vLLM's own, so an entry point changes every AR server. vLLM has no hook that adds a
stat logger for one engine config; :func:`use_for_wedlm_engines` therefore adds this logger to the
list ``AsyncLLM`` reads, and cli.py calls it only when a WeDLM engine config is built with
statistics on. The upstream hook that would replace it: a stat logger plugin that may decline an
engine config, or stat loggers named in vLLM's ``ObservabilityConfig``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.spec_decode.metrics import SpecDecodingProm

from vllm_wedlm.config import asks_for_wedlm

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig, VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerFactory
    from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

_MARK = "_vllm_wedlm_wrapped"


class WeDLMPrometheusStatLogger(PrometheusStatLogger):
    """vLLM's Prometheus logger; for a WeDLM engine, plus the diffusion counters. For any other
    engine config (a later engine of the same process) it is vLLM's logger unchanged."""

    def __init__(self, vllm_config: VllmConfig, engine_indexes: list[int] | None = None) -> None:
        self.wedlm = asks_for_wedlm(vllm_config.additional_config)  # read by super().__init__
        super().__init__(vllm_config, engine_indexes)

    def _spec_decoding_cls(self, speculative_config: SpeculativeConfig | None, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]],
                           is_diffusion: bool = False) -> SpecDecodingProm:
        return SpecDecodingProm(speculative_config, labelnames, per_engine_labelvalues,
                                is_diffusion=is_diffusion or self.wedlm)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats: MultiModalCacheStats | None = None, engine_idx: int = 0) -> None:
        super().record(scheduler_stats, iteration_stats, mm_cache_stats=mm_cache_stats, engine_idx=engine_idx)
        if self.wedlm and scheduler_stats is not None:
            # Consumed here. vLLM's log-line logger (which StatLoggerManager runs after the
            # loggers it was given) would otherwise report them as draft acceptance ("Mean
            # acceptance length" = 1 + tokens per forward, counting a bonus token WeDLM never
            # samples); the engine logs its own "WeDLM decoding: ... tokens per forward" line.
            scheduler_stats.spec_decoding_stats = None


def use_for_wedlm_engines() -> None:
    """Make every ``AsyncLLM`` built later in this process use :class:`WeDLMPrometheusStatLogger`
    in place of vLLM's own (idempotent). Called only once a WeDLM engine is asked for."""
    from vllm.v1.engine import async_llm

    load_plugins = async_llm.load_stat_logger_plugin_factories
    if getattr(load_plugins, _MARK, False):
        return

    @functools.wraps(load_plugins)
    def load_stat_logger_plugin_factories() -> list[StatLoggerFactory]:
        return [*load_plugins(), WeDLMPrometheusStatLogger]

    setattr(load_stat_logger_plugin_factories, _MARK, True)
    async_llm.load_stat_logger_plugin_factories = load_stat_logger_plugin_factories
