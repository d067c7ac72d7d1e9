"""When a step of fixed window rows is worth pipelining (async scheduling on a GPU).

A step scheduled before the one before it is back cannot know its windows' leading runs, so each
window forwards the most it can need, 2W rows. That hides the host's work for a step under the
forward before it, but the padding rows cost forward time once a step has more tokens than the
GPU reads weights for. The scheduler asks ``PaddingGate.pipelines`` each step: pipelined with 2W
rows per window, or after the step before it with each window's exact rows (``W`` plus its run).

The model of a step (H100 measurements of the Qwen3-8B shape, BENCHMARKS 5.7 and 5.8): a forward of
up to ``KNEE_TOKENS`` tokens costs what reading the weights costs; beyond it, each token costs its
FLOPs at ``FLOP_RATE``. Pipelining hides ``HOST_SECONDS`` of host work. So padding pays while its
tokens beyond the knee cost less than that: ``HOST_SECONDS * FLOP_RATE / FLOPs per token`` tokens,
about 120 for an 8B model and tens of thousands for a small one (whose steps are all host).

Pipelining also has a price padding does not set: the step after a request's last one is scheduled
before that last one is back, one forward more per request, and each step's tokens reach the user
after the next step is launched. It hides at most a forward's time of host work per step, so where a
whole forward at the knee costs less than ``HOST_SECONDS`` (models below about 3.4B parameters in
bf16) it loses, measured on the small trained model (BENCHMARKS 5.11 and 5.12: 3.6x against 5.4x AR
at batch 1, a first token 1.23x AR's against 0.82x). The rule, chosen once from the model's size:
such an engine never schedules a window step while the request's step before is in flight (its
window steps run one after the other, each with its exact rows, as with synchronous scheduling),
and AR-decoded requests on it stay pipelined, as vLLM runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Host time per step that overlap hides: a synchronous one-token window step over AR's, batch 1
#: (9.45 against 6.76 ms).
HOST_SECONDS = 2.7e-3
#: What a compute-bound forward achieves per token: 23 µs per token of ~15 GFLOP at batch 64.
FLOP_RATE = 650e12
#: Tokens a forward takes at the cost of its weight reads (bf16: 2 bytes and 2 FLOPs per weight,
#: about 650 TFLOP/s over 2.6 TB/s): a 2W-row step of 16 windows of 16 costs no more than exact rows.
KNEE_TOKENS = 256


@dataclass(frozen=True)
class PaddingGate:
    budget: int
    """Tokens of forward beyond the knee that padding may cost for a step to be pipelined."""

    knee: int
    """Tokens a forward takes at no extra cost (0: every token costs, as on a CPU)."""

    overlap: bool = True
    """Whether a window step may be scheduled while the request's step before is in flight (False:
    a host-bound model's engine, or a synchronous one, whose window steps wait for the one before)."""

    def pipelines(self, padded: int, exact: int) -> bool:
        """Whether a step pads its windows to 2W rows (``padded`` tokens) rather than forwarding each
        window's exact rows (``exact`` tokens); where ``overlap`` holds, a padded step is scheduled
        while the one before it is in flight."""
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


def hides_host_work(hf_config) -> bool:
    """Whether a forward of the model at the knee takes at least the host work pipelining hides
    (the module's rule): about 3.4B parameters and more."""
    return KNEE_TOKENS * flops_per_token(hf_config) / FLOP_RATE >= HOST_SECONDS


def padding_gate(async_scheduling: bool, hf_config, budget: int | None) -> PaddingGate:
    """The gate of an engine; ``budget`` None: "auto". Without async scheduling nothing overlaps,
    so padding never pays ("auto" is 0) and every token counts (no knee). With it, "auto" pipelines
    window steps only for a model whose forward hides the host's work (``hides_host_work``); an
    explicit budget pipelines them for any model (the padding decides their rows)."""
    if not async_scheduling:
        return PaddingGate(budget=budget or 0, knee=0, overlap=False)
    if budget is None:
        if not hides_host_work(hf_config):  # steps one after the other: each window's exact rows
            return PaddingGate(budget=0, knee=0, overlap=False)
        budget = int(HOST_SECONDS * FLOP_RATE / flops_per_token(hf_config))
    return PaddingGate(budget=budget, knee=KNEE_TOKENS)
