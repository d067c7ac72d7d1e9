"""Named training recipes: model shape, data mixture and optimisation, all in one place.

* ``micro``: trains on a 2-core CPU in a few minutes (the test fixture of the WeDLM-speed tests);
* ``small``: the GPU recipe, one H100 for at most ten minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vllm_wedlm.checkpoints.tiny import TinySpec
from vllm_wedlm.training.tasks import MAX_NUMBER


@dataclass(frozen=True)
class Recipe:
    name: str
    model: TinySpec  # shapes of a model trained from scratch (ignored with --from-pretrained)
    task_counts: dict[str, int] = field(default_factory=dict)  # training tasks per kind
    max_number: int = MAX_NUMBER  # how large the numbers of counting and arithmetic tasks get
    vocab_target: int = 1000  # BPE vocabulary of a tokenizer trained from scratch
    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 40
    weight_decay: float = 0.01
    block_size: int = 32  # WeDLM's B
    max_length: int = 192  # tokens per chat (prompt + answer); longer answers are cut
    learnable_im_end: int = 4  # <|im_end|> tokens that end each answer and carry loss
    ar_weight: float = 1.0
    seed: int = 0

    def with_overrides(self, **overrides) -> "Recipe":
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


RECIPES = {
    "micro": Recipe(
        name="micro",
        model=TinySpec(
            variant="qwen3",
            vocab_target=600,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            rope_theta=10000.0,
            dtype="float32",
        ),
        # Only the two low-entropy kinds: on two CPU cores every step counts, and code and prose
        # (long, high-entropy) would take most of them without making the model confident.
        # Numbers below ~40 (loss 0.21 at 900 steps, against 0.50 with the default 150); 16,000
        # arithmetic chats rather than 4,000, which it memorised (training AR loss 0.02, held-out
        # accuracy under 0.1). Counting has only ~600 distinct chats at this size.
        task_counts={"counting": 4000, "arithmetic": 16000},
        max_number=40,
        vocab_target=600,
        steps=900,
        max_length=128,
    ),
    "small": Recipe(
        name="small",
        model=TinySpec(
            variant="qwen3",
            vocab_target=2000,
            hidden_size=384,
            intermediate_size=1152,
            num_hidden_layers=6,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            dtype="bfloat16",
        ),
        task_counts={"counting": 20000, "arithmetic": 20000, "code": 700, "prose": 600},
        vocab_target=2000,
        steps=2500,
        batch_size=64,
        learning_rate=1e-3,
        warmup_steps=150,
        max_length=256,
    ),
}
