"""WeDLM checkpoints in transformers' Auto classes, with ``trust_remote_code`` off.

Published WeDLM checkpoints carry ``auto_map`` (remote code). transformers demands
``trust_remote_code`` only where no local class is registered: ``AutoConfig`` asks whether the
checkpoint's ``model_type`` is in ``CONFIG_MAPPING``, ``AutoModelForCausalLM`` whether the config's
class is in its model mapping. A registered class that is not transformers' own then also wins
over ``auto_map`` where remote code is allowed (transformers' rule for explicitly registered
classes), exactly as vLLM's own config table makes it win inside vLLM. ``AutoTokenizer`` needs no
entry: once ``AutoConfig`` resolves, it takes the class that the checkpoint's
``tokenizer_config.json`` names.

``import vllm_wedlm`` calls :func:`register_with_transformers`, so that any program that imports
the package (the benchmark harness, a notebook) loads WeDLM checkpoints as vLLM does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_wedlm.models.configuration_wedlm import WeDLMConfig

if TYPE_CHECKING:
    from os import PathLike

    from transformers import PreTrainedModel


class WeDLMAsQwenForCausalLM:
    """``AutoModelForCausalLM``'s entry for ``model_type: "wedlm"``: a loader, not a model class.

    A WeDLM model's weights are its base Qwen model's (research/wedlm.md 1.2), so it returns
    transformers' own ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` holding the checkpoint's
    weights. That model decodes autoregressively; WeDLM decoding is vLLM's ``--decoding wedlm``
    or :class:`vllm_wedlm.reference.ReferenceDecoder`.
    """

    config_class = WeDLMConfig  # AutoModelForCausalLM.register checks that it names the config

    @classmethod
    def from_pretrained(cls, path: str | PathLike, *model_args, config: WeDLMConfig | None = None,
                        **kwargs) -> PreTrainedModel:
        from vllm_wedlm.models.transformers_body import qwen_config_for, qwen_model_class

        config = config if config is not None else WeDLMConfig.from_pretrained(path)
        return qwen_model_class(config).from_pretrained(path, *model_args, config=qwen_config_for(config), **kwargs)

    @classmethod
    def _from_config(cls, config: WeDLMConfig, **kwargs) -> PreTrainedModel:
        """What ``AutoModelForCausalLM.from_config`` calls: a randomly initialised model."""
        from vllm_wedlm.models.transformers_body import qwen_config_for, qwen_model_class

        return qwen_model_class(config)._from_config(qwen_config_for(config), **kwargs)


def register_with_transformers() -> None:
    """Register WeDLM's config and causal-LM loader with transformers' Auto classes; idempotent."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(WeDLMConfig.model_type, WeDLMConfig, exist_ok=True)
    AutoModelForCausalLM.register(WeDLMConfig, WeDLMAsQwenForCausalLM, exist_ok=True)


__all__ = ["WeDLMAsQwenForCausalLM", "register_with_transformers"]
