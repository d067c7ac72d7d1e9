"""The vLLM internals the plugin overrides or calls, as vLLM 0.26.0 spells them, and a check of them.

The adapter subclasses vLLM's scheduler, V1 model runner and workers and overrides private methods
whose signatures change between vLLM releases (research/vllm-0.33.md §2: every minor release so far
moved them). A changed one fails with a ``TypeError`` at the first request that reaches it, or
silently binds another method. :func:`check_vllm_contract` compares the installed vLLM with the
table below when the workers import the adapter, so a vLLM other than the pinned one fails at
engine start-up with one message naming every difference. Each entry has a row, with why and what
upstream hook would replace it, in docs/vllm-overrides.md; tests/test_vllm_overrides.py fails for
an override of a vLLM method that is missing here.

Parameters are written as Python writes a signature, without annotations or defaults: ``"*"``
before keyword-only ones, ``"*args"``/``"**kwargs"``, ``"/"`` after positional-only ones.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import NamedTuple

PINNED_VLLM = "0.26.0"
DOC = "docs/vllm-overrides.md"


class Member(NamedTuple):
    """What the plugin expects of one attribute of a vLLM class or module."""

    # The vLLM class whose own definition it must be (``__qualname__``), found along the MRO of the
    # class it is looked up on: an override's ``super()`` reaches that one. None: any (a call).
    defined_in: str | None
    # Its parameters (see the module docstring); None: an attribute that only has to exist.
    params: tuple[str, ...] | None


def _override(defined_in: str, *params: str) -> Member:
    return Member(defined_in, params)


def _call(*params: str) -> Member:
    return Member(None, params)


_SCHEDULER = {  # adapter/scheduler.py: WeDLMScheduler(Scheduler)
    "__init__": _override("Scheduler", "self", "vllm_config", "kv_cache_config", "structured_output_manager",
                          "block_size", "hash_block_size", "mm_registry", "include_finished_set", "log_stats"),
    "_update_after_schedule": _override("Scheduler", "self", "scheduler_output"),
    "_update_request_with_output": _override("Scheduler", "self", "request", "new_token_ids"),
    "update_from_output": _override("Scheduler", "self", "scheduler_output", "model_runner_output"),
    "make_spec_decoding_stats": _override("Scheduler", "self", "spec_decoding_stats", "num_draft_tokens",
                                          "num_accepted_tokens", "num_invalid_spec_tokens", "request_id"),
    "make_stats": _override("Scheduler", "self", "spec_decoding_stats", "kv_connector_stats", "cudagraph_stats",
                            "perf_stats"),  # an AR step's forwards in the diffusion counters
    "shutdown": _override("Scheduler", "self"),
    "_free_request": _override("Scheduler", "self", "request", "delay_free_blocks"),
    "add_request": _override("Scheduler", "self", "request"),  # each request's record (protocol.classify)
    "get_grammar_bitmask": _override("Scheduler", "self", "scheduler_output"),
    "schedule": _override("Scheduler", "self", "throttle_prefills"),  # AR steps (W 0); the step's plan
}

_ASYNC_SCHEDULER = {  # WeDLMFixedRowsScheduler(WeDLMScheduler, AsyncScheduler): the above, and more
    **_SCHEDULER,
    "__init__": _override("AsyncScheduler", "self", "*args", "**kwargs"),
    "_update_after_schedule": _override("AsyncScheduler", "self", "scheduler_output"),
    # Aliased by WeDLMFixedRowsScheduler: the async placeholder accounting must stay in this method.
    "_update_request_with_output": _override("AsyncScheduler", "self", "request", "new_token_ids"),
    "_preempt_request": _override("Scheduler", "self", "request", "timestamp"),
}

_MODEL_RUNNER = {  # adapter/model_runner.py: WeDLMRunnerMixin, on GPUModelRunner and CPUModelRunner
    "_update_states": _override("GPUModelRunner", "self", "scheduler_output"),
    "_prepare_inputs": _override("GPUModelRunner", "self", "scheduler_output", "num_scheduled_tokens"),
    "_prepare_input_ids": _override("GPUModelRunner", "self", "scheduler_output", "num_reqs",
                                    "total_num_scheduled_tokens", "cu_num_tokens"),
    "_calc_spec_decode_metadata": _override("GPUModelRunner", "self", "num_draft_tokens", "cu_num_scheduled_tokens"),
    "_sample": _override("GPUModelRunner", "self", "logits", "spec_decode_metadata"),
    "_bookkeeping_sync": _override("GPUModelRunner", "self", "scheduler_output", "sampler_output", "logits",
                                   "hidden_states", "num_scheduled_tokens"),
    "sample_tokens": _override("GPUModelRunner", "self", "grammar_output"),
    "_dummy_run": _override("GPUModelRunner", "self", "num_tokens", "cudagraph_runtime_mode", "force_attention",
                            "uniform_decode", "allow_microbatching", "skip_eplb", "is_profile", "create_mixed_batch",
                            "remove_lora", "is_graph_capturing", "num_active_loras", "profile_seq_lens"),
    "_determine_batch_execution_and_padding": _override(
        "GPUModelRunner", "self", "num_tokens", "num_reqs", "num_scheduled_tokens_np", "max_num_scheduled_tokens",
        "use_cascade_attn", "allow_microbatching", "force_eager", "force_uniform_decode", "force_has_lora",
        "force_num_active_loras", "num_encoder_reqs"),
    "initialize_metadata_builders": _override("GPUModelRunner", "self", "kv_cache_config", "kernel_block_sizes"),
}

#: vLLM class or module ("module:QualName" or "module") -> attribute -> what the plugin expects.
CONTRACT: dict[str, dict[str, Member]] = {
    "vllm.v1.core.sched.scheduler:Scheduler": {
        **_SCHEDULER,
        "_get_new_block_ids_to_zero": _call("self"),  # called by WeDLMScheduler._ride_first_windows
    },
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler": _ASYNC_SCHEDULER,
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner": {
        **_MODEL_RUNNER,
        "__init__": _override("GPUModelRunner", "self", "vllm_config", "device"),
    },
    # The same overrides, reached through CPUModelRunner (which overrides none of them in 0.26.0).
    "vllm.v1.worker.cpu_model_runner:CPUModelRunner": {
        **_MODEL_RUNNER,
        "__init__": _override("CPUModelRunner", "self", "vllm_config", "device"),
    },
    "vllm.v1.worker.gpu_worker:Worker": {  # adapter/gpu_worker.py
        "init_device": _override("Worker", "self"),
        "compile_or_warm_up_model": _override("Worker", "self"),
    },
    "vllm.v1.worker.cpu_worker:CPUWorker": {  # adapter/cpu_worker.py
        "init_device": _override("CPUWorker", "self"),
    },
    "vllm.v1.sample.logits_processor.interface:LogitsProcessor": {  # adapter/request_validator.py
        "validate_params": _override("LogitsProcessor", "sampling_params"),  # a classmethod
        "__init__": _override("LogitsProcessor", "self", "vllm_config", "device", "is_pin_memory"),
        "apply": _override("LogitsProcessor", "self", "logits"),
        "is_argmax_invariant": _override("LogitsProcessor", "self"),
        "update_state": _override("LogitsProcessor", "self", "batch_update"),
    },
    "vllm.model_executor.models.config:VerifyAndUpdateConfig": {  # adapter/config_hook.py
        "verify_and_update_config": _override("VerifyAndUpdateConfig", "vllm_config"),  # a staticmethod
    },
    "vllm.v1.metrics.loggers:PrometheusStatLogger": {  # adapter/metrics.py
        "__init__": _override("PrometheusStatLogger", "self", "vllm_config", "engine_indexes"),
        # A class attribute (SpecDecodingProm) in vLLM; the plugin overrides it with a method.
        "_spec_decoding_cls": _override("PrometheusStatLogger", "speculative_config", "labelnames",
                                        "per_engine_labelvalues", "is_diffusion"),
        "record": _override("PrometheusStatLogger", "self", "scheduler_stats", "iteration_stats", "mm_cache_stats",
                            "engine_idx"),
    },
    # Called with positional arguments, or patched, outside a subclass.
    "vllm.v1.core.kv_cache_manager:KVCacheManager": {
        "allocate_slots": _call("self", "request", "num_new_tokens", "num_new_computed_tokens", "new_computed_blocks",
                                "num_lookahead_tokens", "num_external_computed_tokens", "delay_cache_blocks",
                                "num_encoder_tokens", "full_sequence_must_fit", "reserved_blocks",
                                "has_scheduled_reqs"),
    },
    "vllm.v1.core.kv_cache_manager:KVCacheBlocks": {"get_block_ids": _call("self", "allow_none")},
    "vllm.v1.worker.block_table:MultiGroupBlockTable": {
        "compute_slot_mapping": _call("self", "num_reqs", "query_start_loc", "positions"),
    },
    "vllm.v1.worker.gpu_input_batch:InputBatch": {  # RowLayout.end_thinking, under async scheduling
        "update_async_output_token_ids": _call("self"),
    },
    "vllm.v1.sample.thinking_budget_state:ThinkingBudgetStateHolder": {  # RowLayout.end_thinking
        "has_tracked_requests": _call("self"),
        "update_state": _call("self", "output_token_ids", "spec_token_ids", "repeat_indices"),
        "apply_to_logits": _call("self", "logits", "predict_bonus_token", "spec_token_ids"),
    },
    "vllm.v1.structured_output:StructuredOutputManager": {  # adapter/grammar_rows.py
        "grammar_init": _call("self", "request"),  # WindowGrammars compiles the runner's grammars with it
        "should_fill_bitmask": _call("self", "request"),  # note_reasoning_end: has the reasoning ended
        "should_advance": _call("self", "request"),  # ... which reads what note_reasoning_end marks
        "trim_reasoning_for_advance": _call("self", "request", "new_token_ids"),
    },
    "vllm.v1.structured_output.request:StructuredOutputRequest": {  # written by note_reasoning_end
        "reasoning_ended": Member(None, None),
        "reasoning_end_token_index": Member(None, None),
    },
    "vllm.v1.spec_decode.metrics:SpecDecodingStats": {"new": _call("num_spec_tokens")},
    "vllm.v1.spec_decode.metrics:SpecDecodingProm": {
        "__init__": _call("self", "speculative_config", "labelnames", "per_engine_labelvalues", "is_diffusion"),
    },
    "vllm.engine.arg_utils:EngineArgs": {  # cli.py wraps these three (the wrappers keep __wrapped__)
        "add_cli_args": _call("parser"),
        "from_cli_args": _call("args"),
        "create_engine_config": _call("self", "usage_context", "headless"),
    },
    "vllm.v1.engine.async_llm": {"load_stat_logger_plugin_factories": _call()},  # replaced by adapter/metrics.py
    "vllm.transformers_utils.config": {"_CONFIG_REGISTRY": Member(None, None)},  # written by plugin.py
    "vllm.model_executor.models.config": {"MODELS_CONFIG_MAP": Member(None, None)},  # written by plugin.py
    "vllm.model_executor.models.qwen2:Qwen2ForCausalLM": {  # built by models/wedlm.py
        "__init__": _call("self", "*", "vllm_config", "prefix"),
    },
    "vllm.model_executor.models.qwen3:Qwen3ForCausalLM": {"__init__": _call("self", "*", "vllm_config", "prefix")},
}

# Checked only in a process that imported them already, never imported here: importing vLLM's CPU
# runner or worker replaces torch.cuda.Stream and torch.Event process-wide (adapter/gpu_worker.py),
# and AsyncLLM's module (the front end's, which adapter/metrics.py patches there) costs 0.15 s.
# The CPU classes' overrides are GPUModelRunner's and Worker's, checked everywhere, plus their own
# ``__init__``/``init_device``, checked where adapter/cpu_worker.py imported them.
LAZY_MODULES = frozenset({"vllm.v1.worker.cpu_model_runner", "vllm.v1.worker.cpu_worker", "vllm.v1.engine.async_llm"})


#: Instance attributes of vLLM's V1 model runner (``GPUModelRunner``; the CPU runner's are its) that
#: the adapter reads or writes: the row layouts through ``runner.``, the runner mixin through ``self.``
#: (set by ``__init__``; ``model``, set when the model loads, is left to its first use). A class table cannot see them,
#: so ``check_runner_attributes`` looks for them on the runner once it is built.
RUNNER_ATTRIBUTES = (
    "attn_groups", "device", "discard_request_mask", "dtype", "input_batch", "input_ids", "max_model_len",
    "max_num_reqs", "model_config", "num_computed_tokens", "num_scheduled_tokens", "positions", "query_pos",
    "query_start_loc", "req_indices", "requests", "scheduler_config", "seq_lens", "use_async_scheduling",
    "vllm_config",
)
#: ... and of the runner's ``InputBatch`` (``runner.input_batch``).
INPUT_BATCH_ATTRIBUTES = (
    "block_table", "generators", "logitsprocs", "num_computed_tokens_cpu", "num_reqs", "num_tokens_no_spec",
    "prev_sampled_token_ids", "req_ids", "req_output_token_ids", "sampling_metadata",
    "thinking_budget_state_holder", "update_async_output_token_ids",
)


class VLLMContractError(ImportError):
    """The installed vLLM differs from the one the plugin's overrides were written for."""


def params_of(obj: object) -> tuple[str, ...]:
    """``obj``'s parameters as :class:`Member` writes them (a bound method's without ``self``;
    a wrapper's are those of what its ``__wrapped__`` names)."""
    rendered: list[str] = []
    star = False
    parameters = list(inspect.signature(obj).parameters.values())
    for i, p in enumerate(parameters):
        if p.kind is p.VAR_POSITIONAL:
            rendered.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            rendered.append(f"**{p.name}")
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                rendered.append("*")
                star = True
            rendered.append(p.name)
        following = parameters[i + 1].kind if i + 1 < len(parameters) else None
        if p.kind is p.POSITIONAL_ONLY and following is not p.POSITIONAL_ONLY:
            rendered.append("/")
    return tuple(rendered)


def _resolve(path: str) -> object:
    module, _, qualname = path.partition(":")
    target: object = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        target = getattr(target, part)
    return target


def _differences(name: str, target: object, members: Mapping[str, Member]) -> list[str]:
    found = []
    for attr, expected in members.items():
        where = f"{name}.{attr}"
        if not hasattr(target, attr):
            found.append(f"{where}: missing")
            continue
        if expected.defined_in is not None:
            owner = next(k for k in inspect.getmro(target) if attr in vars(k))  # target is a class here
            if owner.__qualname__ != expected.defined_in:
                found.append(f"{where}: now defined in {owner.__qualname__}, expected in {expected.defined_in}")
        if expected.params is not None:
            try:
                params = params_of(getattr(target, attr))
            except (TypeError, ValueError) as error:
                found.append(f"{where}: no signature ({error})")
                continue
            if params != expected.params:
                found.append(f"{where}: parameters ({', '.join(params)}), expected ({', '.join(expected.params)})")
    return found


def check_runner_attributes(runner: object) -> None:
    """Raise :class:`VLLMContractError` naming every attribute of ``RUNNER_ATTRIBUTES`` that the built
    runner lacks, and of ``INPUT_BATCH_ATTRIBUTES`` that its input batch lacks (a property is looked
    up on the class, never run)."""

    def has(obj: object, attr: str) -> bool:
        return attr in getattr(obj, "__dict__", {}) or hasattr(type(obj), attr)

    differences = [f"{type(runner).__name__}.{attr}: missing" for attr in RUNNER_ATTRIBUTES if not has(runner, attr)]
    batch = getattr(runner, "input_batch", None)
    if batch is not None:
        differences += [f"{type(batch).__name__}.{attr}: missing" for attr in INPUT_BATCH_ATTRIBUTES
                        if not has(batch, attr)]
    _raise(differences)


def check_vllm_contract(contract: Mapping[str, Mapping[str, Member]] = CONTRACT,
                        targets: Mapping[str, object] | None = None) -> None:
    """Raise :class:`VLLMContractError` naming every entry of ``contract`` that the installed vLLM
    lacks or spells differently. ``targets``: contract key -> the class or module to check in place
    of importing it (for tests of this check)."""
    differences = []
    for path, members in contract.items():
        if targets is not None and path in targets:
            target = targets[path]
        elif path.partition(":")[0] in LAZY_MODULES and path.partition(":")[0] not in sys.modules:
            continue
        else:
            try:
                target = _resolve(path)
            except (ImportError, AttributeError) as error:
                differences.append(f"{path}: cannot be imported ({error})")
                continue
        differences += _differences(path.rpartition(":")[2] or path, target, members)
    _raise(differences)


def _raise(differences: list[str]) -> None:
    if differences:
        import vllm

        raise VLLMContractError(
            f"vllm_wedlm overrides vLLM {PINNED_VLLM} internals, and the installed vLLM "
            f"{getattr(vllm, '__version__', '(unknown version)')} differs:\n  "
            + "\n  ".join(differences)
            + f"\nInstall vLLM {PINNED_VLLM}, or port the overrides and update their rows in {DOC}.")
