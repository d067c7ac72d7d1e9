"""Prometheus metric families: those a server exposes, and those vLLM's own logger registers."""

from __future__ import annotations

import requests

import vllm_wedlm


def families(text: str, prefix: str = "") -> set[tuple[str, str]]:
    """``(name, type)`` of each metric family in a Prometheus text exposition."""
    declared = (line.split() for line in text.splitlines() if line.startswith("# TYPE "))
    return {(name, kind) for _, _, name, kind in declared if name.startswith(prefix)}


def served_families(base: str, prefix: str = "") -> set[tuple[str, str]]:
    return families(requests.get(f"{base}/metrics", timeout=30).text, prefix)


def stock_vllm_families(serve_argv: list[str]) -> set[tuple[str, str]]:
    """The ``vllm:`` families that vLLM's own ``PrometheusStatLogger`` registers for the engine
    config of ``vllm serve *serve_argv``: the config is built in this process, no engine starts."""
    vllm_wedlm.register()  # the plugin's flags, and its model and config classes
    from prometheus_client import REGISTRY, generate_latest
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(serve_argv)
    logger = PrometheusStatLogger(AsyncEngineArgs.from_cli_args(args).create_engine_config(), [0])
    logger.log_engine_initialized()  # what the engine client does once the engine is up
    if args.tool_call_parser is not None:  # what the API server registers for a tool parser
        from vllm.parser.metrics import init_parser_metrics

        init_parser_metrics(model_name=str(args.model))
    try:
        return families(generate_latest(REGISTRY).decode(), "vllm:")
    finally:
        unregister_vllm_metrics()
