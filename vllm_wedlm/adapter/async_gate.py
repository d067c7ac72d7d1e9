"""When a step of fixed window rows is worth pipelining (async scheduling on a GPU).

A step scheduled before the one before it is back cannot know its windows' leading runs, so each
window forwards the most it can need, 2W rows. That hides the host's work for a step under the
forward before it, but the padding rows cost forward time once a step has more tokens than the
GPU reads weights for. The scheduler asks ``PaddingGate.pipelines`` each step: pipelined with 2W
rows per window, or after the step before it with each window's exact rows (``W`` plus its run).

The model of a step (H100 measurements of the Qwen3-8B shape, lab notebook 5.7 and 5.8): a forward of
up to ``KNEE_TOKENS`` tokens costs what reading the weights costs; beyond it, each token costs its
FLOPs at ``FLOP_RATE``. Pipelining hides ``HOST_SECONDS`` of host work. So padding pays while its
tokens beyond the knee cost less than that: ``HOST_SECONDS * FLOP_RATE / FLOPs per token`` tokens,
about 120 for an 8B model and tens of thousands for a small one (whose steps are all host).

**Which engine a model gets by default** (``default_async_scheduling``, once at start-up). Pipelining
hides at most a forward's time of host work per step, and it costs: the step after a request's last
one is scheduled before that last one is back, and each step's tokens reach the user after the next
step is launched. Where a whole forward at the knee costs less than ``HOST_SECONDS`` (models below
about 3.4B parameters in bf16) it loses, measured on one H100 with the trained ``small`` model,
arithmetic, WeDLM / AR (lab notebook 5.16): pipelined fixed rows 3.6x at batch 1 against 5.4x
synchronous (5.11), and fixed rows whose window steps wait for the one before under async
scheduling 4.9x against 6.6x at batch 1, 1.9x against 2.6x at batch 64 (the same tokens per forward:
the empty schedule of each wait costs). So such a model's engine schedules synchronously with exact
rows unless the user asks for ``--async-scheduling``; a larger one (the Qwen3-8B shape: a one-token
window step 1.10x AR's against 1.43x synchronous) gets vLLM's async scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_wedlm.core.window_policy import StepCost

#: Host time per step that overlap hides: a synchronous one-token window step over AR's, batch 1
#: (9.45 against 6.76 ms).
HOST_SECONDS = 2.7e-3
#: What a compute-bound forward achieves per token: 23 µs per token of ~15 GFLOP at batch 64.
FLOP_RATE = 650e12
#: Tokens a forward takes at the cost of its weight reads (bf16: 2 bytes and 2 FLOPs per weight,
#: about 650 TFLOP/s over 2.6 TB/s): a 2W-row step of 16 windows of 16 costs no more than exact rows.
KNEE_TOKENS = 256
#: Rows a window step takes before each costs its FLOPs, for the adaptive window's cost curve: the
#: knee the steps show, below the weight-read roofline's. Qwen3-8B shape, W 1 windows (2 rows each),
#: one H200, lab notebook 5.20: 5.38 / 5.62 / 7.33 ms at 2 / 32 / 128 rows, 18 µs a row past 32.
WINDOW_KNEE_TOKENS = 32


@dataclass(frozen=True)
class PaddingGate:
    budget: int
    """Tokens of forward beyond the knee that padding may cost for a step to be pipelined."""

    knee: int
    """Tokens a forward takes at no extra cost (0: every token costs, as on a CPU)."""

    def pipelines(self, padded: int, exact: int) -> bool:
        """Whether a step of ``padded`` tokens (2W rows per window) is worth running pipelined rather
        than one of ``exact`` tokens after the step before it."""
        return max(padded, self.knee) - max(exact, self.knee) <= self.budget


def flops_per_token(hf_config) -> float:
    """Forward FLOPs per token of a dense decoder's layers (2 per weight of the attention and MLP
    projections; the LM head runs on a window's mask rows only)."""
    hidden = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    mlp = 3 * hidden * hf_config.intermediate_size  # gate, up, down
    return 2.0 * hf_config.num_hidden_layers * (attention + mlp)


def padding_gate(async_scheduling: bool, hf_config, budget: int | None) -> PaddingGate:
    """The gate of an engine; ``budget`` None: "auto". Without async scheduling nothing overlaps,
    so padding never pays ("auto" is 0) and every token counts (no knee)."""
    if not async_scheduling:
        return PaddingGate(budget=budget or 0, knee=0)
    if budget is None:
        budget = int(HOST_SECONDS * FLOP_RATE / flops_per_token(hf_config))
    return PaddingGate(budget=budget, knee=KNEE_TOKENS)


def hides_host_work(hf_config) -> bool:
    """Whether a forward of the model at the knee takes at least the host work pipelining hides:
    about 3.4B parameters and more (the module's rule)."""
    return KNEE_TOKENS * flops_per_token(hf_config) / FLOP_RATE >= HOST_SECONDS


def default_async_scheduling(requested: bool | None, hf_config) -> bool | None:
    """vLLM's ``async_scheduling`` for a WeDLM engine on CUDA: the user's (``--async-scheduling`` /
    ``--no-async-scheduling``) where given; else vLLM's default (None, async) for a model whose
    forward hides the host's work, and synchronous (False) for a smaller one."""
    if requested is not None:
        return requested
    return None if hides_host_work(hf_config) else False


def step_cost(hf_config, knee: int | None = None) -> StepCost:
    """This module's model of a step as the adaptive window's cost curve (``core.window_policy``):
    the host work and a forward at the knee (``WINDOW_KNEE_TOKENS``, or ``knee``:
    ``--wedlm-window-tokens``) fixed, each row beyond it its FLOPs at ``FLOP_RATE``."""
    knee = WINDOW_KNEE_TOKENS if knee is None else knee
    per_row = flops_per_token(hf_config) / FLOP_RATE
    return StepCost(fixed=HOST_SECONDS + knee * per_row, per_row=per_row, knee=knee)
