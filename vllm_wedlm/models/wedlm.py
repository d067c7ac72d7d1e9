"""``WeDLMForCausalLM`` for vLLM: vLLM's own Qwen2 or Qwen3 body, chosen by the config's flags.

A WeDLM checkpoint has exactly the tensors of its base Qwen model (research/wedlm.md 1.2): no extra
heads, the mask token is an ordinary embedding row. So the model is ``Qwen3ForCausalLM`` with one
change, the body class, and its weights load through the inherited ``load_weights``.
"""

from __future__ import annotations

from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.qwen2 import Qwen2Model
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM, Qwen3Model
from vllm.model_executor.models.utils import PPMissingLayer, maybe_prefix

from vllm_wedlm.models.configuration_wedlm import body_of

# Qwen2Model reads `qk_norm` (False for WeDLM-7B) and always has q/k/v biases;
# Qwen3Model always has q/k norms and reads `attention_bias` (False for WeDLM-8B).
_BODIES: dict[str, type[nn.Module]] = {"Qwen2": Qwen2Model, "Qwen3": Qwen3Model}


class WeDLMForCausalLM(Qwen3ForCausalLM):
    """A WeDLM checkpoint as a vLLM causal LM (forward, logits and weight loading unchanged)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        # Qwen3ForCausalLM.__init__ hard-codes its body; this is that constructor with the body
        # picked from the config, so nothing is built twice.
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.vllm_config = vllm_config
        self.quant_config = vllm_config.quant_config
        self.model = _BODIES[body_of(config)](
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model")
        )
        if get_pp_group().is_last_rank:
            if config.tie_word_embeddings:
                self.lm_head = self.model.embed_tokens
            else:
                self.lm_head = ParallelLMHead(
                    config.vocab_size,
                    config.hidden_size,
                    quant_config=self.quant_config,
                    prefix=maybe_prefix(prefix, "lm_head"),
                )
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
