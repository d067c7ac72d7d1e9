"""vLLM's per-architecture config hook for ``WeDLMForCausalLM`` (``MODELS_CONFIG_MAP``).

It runs inside ``VllmConfig.__post_init__``, in the process that builds the config, before the
engine starts: bad settings fail before any weight is loaded, and in WeDLM mode it installs the
plugin's scheduler and worker through vLLM's own config fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm import envs
from vllm.logger import init_logger
from vllm.model_executor.models.config import VerifyAndUpdateConfig

from vllm_wedlm.adapter.async_gate import default_async_scheduling
from vllm_wedlm.adapter.custom_processors import refuse_on_fixed_rows
from vllm_wedlm.config import ASYNC_PADDING_KEY, WeDLMSettings, max_window_tokens
from vllm_wedlm.models.configuration_wedlm import body_of

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Under "vllm." so that vLLM's logging configuration (handler, level, format) applies.
logger = init_logger("vllm.wedlm")

SCHEDULER_CLS = "vllm_wedlm.adapter.scheduler.WeDLMScheduler"
FIXED_ROWS_SCHEDULER_CLS = "vllm_wedlm.adapter.scheduler.WeDLMFixedRowsScheduler"
WORKER_CLS = {
    "cpu": "vllm_wedlm.adapter.cpu_worker.WeDLMCPUWorker",
    "cuda": "vllm_wedlm.adapter.gpu_worker.WeDLMGPUWorker",
}


class WeDLMConfigHook(VerifyAndUpdateConfig):
    @staticmethod
    def verify_and_update_config(vllm_config: VllmConfig) -> None:
        settings = WeDLMSettings.from_additional_config(vllm_config.additional_config)
        hf_config = vllm_config.model_config.hf_config
        body_of(hf_config)
        if settings.wedlm:
            configure_wedlm_mode(vllm_config, settings)


#: The most sequences a WeDLM engine runs on CUDA (see ``_fit_windows``).
MAX_CUDA_SEQS = 512


def _refuse(reason: str) -> None:
    raise ValueError(f"--decoding wedlm: {reason}")


def configure_wedlm_mode(vllm_config: VllmConfig, settings: WeDLMSettings) -> None:
    """Check that WeDLM mode can run with ``vllm_config``, then set vLLM's fields for it: worker,
    request validator, scheduling and scheduler, and a token budget every window fits."""
    platform = _supported_platform(vllm_config)
    custom = _install_request_validator(vllm_config, settings)
    settings = _choose_scheduling(vllm_config, settings, platform, custom)
    _fit_windows(vllm_config, settings, platform)
    _log_settings(settings)


def _supported_platform(vllm_config: VllmConfig) -> str:
    """"cuda" or "cpu", once the model and settings are ones WeDLM mode runs; installs its worker."""
    from vllm.platforms import current_platform

    hf_config = vllm_config.model_config.hf_config
    if not 0 <= hf_config.mask_token_id < hf_config.vocab_size:
        _refuse(f"mask_token_id {hf_config.mask_token_id} is outside the vocabulary of {hf_config.vocab_size}")
    if vllm_config.speculative_config is not None:
        _refuse("speculative decoding cannot be combined with WeDLM decoding")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        _refuse("pipeline parallelism is not supported")
    platform = "cuda" if current_platform.is_cuda() else "cpu" if current_platform.is_cpu() else None
    if platform is None:
        _refuse(f"platform {current_platform.device_name!r} is not supported (CUDA and CPU are)")

    # The plugin drives vLLM's V1 model runner, on CPU and GPU; never fall back silently.
    if envs.VLLM_USE_V2_MODEL_RUNNER:
        _refuse("it runs on vLLM's V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER")

    parallel = vllm_config.parallel_config
    if parallel.worker_cls not in ("auto", WORKER_CLS[platform]):
        _refuse(f"a custom worker ({parallel.worker_cls}) cannot be combined with it")
    parallel.worker_cls = WORKER_CLS[platform]
    return platform


def _install_request_validator(vllm_config: VllmConfig, settings: WeDLMSettings) -> list[str]:
    """Per-request validation in the front end (a 400 for unsupported requests, request_validator.py),
    against ``settings``; returns the custom logits processors the engine was given besides it."""
    from vllm_wedlm.adapter.request_validator import QUALNAME as qualname
    from vllm_wedlm.adapter.request_validator import serve

    serve(settings)

    model_config = vllm_config.model_config
    custom = [str(getattr(p, "__qualname__", p)) for p in model_config.logits_processors or []
              if p != qualname]
    if qualname not in (model_config.logits_processors or []):
        model_config.logits_processors = [*(model_config.logits_processors or []), qualname]
    # vLLM 0.26.0 runs an engine with a custom logits processor on its V1 runner (the V2 runner does
    # not support them), the validator's only other effect: no process-wide setting is needed, and
    # other engines of the same process keep vLLM's own choice.
    if vllm_config.use_v2_model_runner:
        _refuse("vLLM chose its V2 model runner; the plugin drives the V1 runner")
    return custom


def _choose_scheduling(vllm_config: VllmConfig, settings: WeDLMSettings, platform: str,
                       custom: list[str]) -> WeDLMSettings:
    """Async or synchronous scheduling, the row layout that goes with it and its scheduler class; the
    settings with that layout.

    Async scheduling schedules a step before the previous one's result is back, so windows must
    not need it on the host: they are laid out from the runner's device table (fixed window
    rows, FIXED_ROWS_KEY). On CUDA that is the default, as async scheduling is vLLM's default
    for AR, except for a model too small for its forward to hide the host's work, which runs
    faster synchronously (async_gate.default_async_scheduling, measured). --async-scheduling and
    --no-async-scheduling (True / False here; no flag is None, which vLLM resolves after this
    hook, to on unless its executor cannot) decide for themselves. Fixed window rows also run
    right if vLLM then schedules synchronously. Otherwise each window forwards exactly its own
    rows, known on the host. vLLM's CPU platform never schedules async; fixed window rows can be
    asked for there (additional_config) to test them."""
    scheduler = vllm_config.scheduler_config
    if platform == "cuda":
        if custom and scheduler.async_scheduling is None:
            # Custom logits processors need each window row's context on the host (custom_processors.py).
            logger.info("WeDLM: synchronous scheduling, for the custom logits processors %s", ", ".join(custom))
            scheduler.async_scheduling = False
        scheduler.async_scheduling = default_async_scheduling(scheduler.async_scheduling,
                                                              vllm_config.model_config.hf_text_config)
    if platform == "cuda" and scheduler.async_scheduling is not False and not settings.fixed_window_rows:
        settings = settings.with_fixed_window_rows(vllm_config.additional_config)
    elif platform != "cuda" or not settings.fixed_window_rows:
        scheduler.async_scheduling = False
    if settings.async_padding_tokens is not None and not settings.fixed_window_rows:
        _refuse(f"{ASYNC_PADDING_KEY} (--wedlm-async-padding-tokens) applies to async scheduling only: add "
                "--async-scheduling (on a GPU) or drop it")
    if settings.fixed_window_rows:
        refuse_on_fixed_rows(custom)
    scheduler_cls = FIXED_ROWS_SCHEDULER_CLS if settings.fixed_window_rows else SCHEDULER_CLS
    if scheduler.scheduler_cls not in (None, SCHEDULER_CLS, FIXED_ROWS_SCHEDULER_CLS):
        _refuse(f"a custom scheduler ({scheduler.scheduler_cls}) cannot be combined with it")
    scheduler.scheduler_cls = scheduler_cls
    if settings.fixed_window_rows:
        # Cascade attention plans from the host's token counts, which only bound a window's start.
        vllm_config.model_config.disable_cascade_attn = True
    return settings


def _fit_windows(vllm_config: VllmConfig, settings: WeDLMSettings, platform: str) -> None:
    """Every running request's window within one step's token budget (``max_num_seqs``), and on CUDA
    the graphs captured for the steps that budget allows."""
    scheduler = vllm_config.scheduler_config
    window_tokens = max_window_tokens(settings.window_size)
    max_seqs = scheduler.max_num_batched_tokens // window_tokens
    if max_seqs < 1:
        _refuse(f"max_num_batched_tokens {scheduler.max_num_batched_tokens} is below the {window_tokens} "
                f"tokens of one window of size {settings.window_size}")
    if scheduler.max_num_seqs > max_seqs:
        logger.info("WeDLM: max_num_seqs %d -> %d so that every window fits the token budget",
                    scheduler.max_num_seqs, max_seqs)
        scheduler.max_num_seqs = max_seqs
    if platform == "cuda" and scheduler.max_num_seqs > MAX_CUDA_SEQS:
        # On an H100 every WeDLM engine of more than 512 sequences (vLLM's vllm.LLM default there is
        # 1024) failed at start-up with an illegal memory access in vLLM's graph-memory profile of
        # its mixed-batch captures (window 4, 8 and 16; 512 sequences started, and vLLM's AR at 1024
        # too): the cause is not found (docs/gpu-test-runs.md, session 34).
        logger.info("WeDLM: max_num_seqs %d -> %d (larger failed to start on CUDA)", scheduler.max_num_seqs,
                    MAX_CUDA_SEQS)
        scheduler.max_num_seqs = MAX_CUDA_SEQS
    if platform == "cuda":
        configure_cuda_graphs(vllm_config, scheduler.max_num_seqs * window_tokens)


def _log_settings(settings: WeDLMSettings) -> None:
    adaptive = ""
    if settings.adaptive_window:
        knee = "the model's" if settings.window_tokens is None else str(settings.window_tokens)
        adaptive = f" at most, each request's sized per step (knee: {knee} rows)"
    logger.info("WeDLM decoding: window %d%s, entropy threshold %s, position penalty %s, lossless %s, %s",
                settings.window_size, adaptive, settings.params.entropy_threshold, settings.params.pos_penalty,
                settings.params.lossless,
                "fixed window rows (pipelined under async scheduling)" if settings.fixed_window_rows else
                "exact window rows (synchronous scheduling)")


def graph_sizes(max_tokens: int) -> list[int]:
    """Token counts to capture CUDA graphs for, up to ``max_tokens``: vLLM's own steps (1, 2, 4,
    every 8 to 256, every 16 to 512), then every 64 (padding costs at most 63 tokens, under 13%)."""
    sizes = {1, 2, 4, *range(8, 256, 8), *range(256, 512, 16), *range(512, max_tokens + 1, 64), max_tokens}
    return sorted(size for size in sizes if size <= max_tokens)


def configure_cuda_graphs(vllm_config: VllmConfig, window_tokens: int) -> None:
    """Every WeDLM step replays a CUDA graph, a whole-step (FULL) one with FlashAttention.

    vLLM's defaults fit AR: graphs up to 2 x max_num_seqs tokens (at most 512), FULL graphs for
    uniform decode batches and PIECEWISE ones (attention run eagerly between graph pieces) for
    mixed batches. A WeDLM step forwards up to ``window_tokens`` (every running window, whole) and
    windows are mixed batches, so with the defaults large batches ran with no graph at all and the
    rest PIECEWISE. Here capture sizes reach ``window_tokens``, and with FlashAttention the mode is
    ``FULL``, so mixed batches replay FULL graphs too (``full_graph_backend``); the runner then has
    FlashAttention compute its schedule inside those graphs (``initialize_metadata_builders``). A
    user's own mode and capture sizes stay.
    """
    from vllm.config import CUDAGraphMode

    compilation = vllm_config.compilation_config
    if vllm_config.model_config.enforce_eager:
        return
    if compilation.cudagraph_mode is None and full_graph_backend(vllm_config):
        compilation.cudagraph_mode = CUDAGraphMode.FULL
    if compilation.cudagraph_capture_sizes is None and compilation.max_cudagraph_capture_size is None:
        most = min(window_tokens, vllm_config.scheduler_config.max_num_batched_tokens)
        compilation.cudagraph_capture_sizes = graph_sizes(most)
        mode = compilation.cudagraph_mode.name if compilation.cudagraph_mode else "vLLM's default"
        logger.info("WeDLM: CUDA graphs (%s) for steps of up to %d tokens (%d sizes)", mode, most,
                    len(compilation.cudagraph_capture_sizes))


def full_graph_backend(vllm_config: VllmConfig) -> bool:
    """Whether the engine's attention will be FlashAttention, whose FULL graphs WeDLM steps replay.

    vLLM picks it on its own for float16 and bfloat16 models on the GPUs it supports. Elsewhere
    vLLM's default mode stays (windows replay PIECEWISE graphs): FlexAttention (which float32
    engines need for exact results) fails to capture FULL graphs of mixed batches in vLLM 0.26.0
    (its block mask is built for more KV blocks than a request's row has) and takes 1.6 s per
    captured size, and no other backend was tried.
    """
    import torch

    backend = vllm_config.attention_config.backend
    if backend is not None:
        return backend.name == "FLASH_ATTN"
    return vllm_config.model_config.dtype in (torch.float16, torch.bfloat16)
