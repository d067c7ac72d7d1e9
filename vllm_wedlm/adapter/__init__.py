"""The WeDLM mode's hooks into vLLM: config hook, scheduler, model runner and workers, metrics and
request validation. The other places that touch vLLM beyond its public API: cli.py (wraps three
``EngineArgs`` methods) and plugin.py (writes vLLM's config registry). vllm_contract.py lists every
vLLM internal they override or call, checked when a worker imports the adapter (docs/vllm-overrides.md)."""
