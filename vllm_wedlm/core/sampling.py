"""Drawing a token for each mask row (wedlm.md 2.5), for all rows of a step at once.

Order, as in WeDLM: top-k on the raw logits, then top-p on their softmax, then temperature, then
min-p (vLLM's: drop tokens below min_p times the most likely one's probability; the ratio does not
depend on whether top-k/top-p renormalised first), then one draw per row. Temperature 0 is greedy
(top-k/top-p/min-p do not matter then). The mask token itself is never drawn: committing it would
put the placeholder into the text (WeDLM's engine does not ban it; a trained model almost never
picks it, an untrained one may). Except for a request
decoded autoregressively on a WeDLM engine (``ban_mask_token`` False): it draws from the whole
vocabulary, as vLLM's own sampler does in ``--decoding ar``, so that greedy output is the same.

The draw is an exponential race: argmax(p / q) with q ~ Exp(1) per vocabulary entry is a sample
from p. A seeded request draws its q from its own generator, so its tokens do not depend on the
other requests in the batch; ``sample_request`` is the one-request statement of the same draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling settings (vLLM's conventions: top_k 0 or -1 and top_p 1 mean off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    generator: torch.Generator | None = None  # seeded requests; on the logits' device
    ban_mask_token: bool = True  # False for AR-decoded requests (next-token rows, not mask rows)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling settings of a step's N logits rows (rows grouped by request). A setting no
    row uses is None: the host knows that already, so the step skips its work without asking the
    device."""

    temperature: torch.Tensor | None  # [N] float32, 0 = greedy; None when all rows are greedy
    top_k: torch.Tensor | None  # [N] int64, 0 or >= V = off; None when no row uses it
    top_p: torch.Tensor | None  # [N] float32, 1 = off; None when no row uses it
    ban_mask_token: torch.Tensor | None  # [N] bool; None: every row bans it
    min_p: torch.Tensor | None = None  # [N] float32, 0 = off; None when no row uses it
    # Seeded requests: (first row, row count, generator). Unseeded rows use the global stream.
    generators: list[tuple[int, int, torch.Generator]] = field(default_factory=list)

    @staticmethod
    def of(specs: list[SamplingSpec], rows_per_spec: list[int], device: torch.device | str = "cpu") -> SamplingBatch:
        """The batch of ``specs``, request i owning the next ``rows_per_spec[i]`` rows."""
        def per_row(values, dtype):
            return torch.tensor([v for v, n in zip(values, rows_per_spec, strict=True) for _ in range(n)],
                                dtype=dtype, device=device)

        starts = [sum(rows_per_spec[:i]) for i in range(len(specs))]
        top_k = [max(spec.top_k, 0) for spec in specs]
        sampled = [spec for spec, n in zip(specs, rows_per_spec, strict=True) if n and not spec.greedy]
        return SamplingBatch(
            temperature=per_row([spec.temperature for spec in specs], torch.float32) if sampled else None,
            top_k=per_row(top_k, torch.long) if any(spec.top_k > 0 for spec in sampled) else None,
            top_p=per_row([spec.top_p for spec in specs], torch.float32) if any(spec.top_p < 1 for spec in sampled)
            else None,
            ban_mask_token=per_row([spec.ban_mask_token for spec in specs], torch.bool),
            min_p=per_row([spec.min_p for spec in specs], torch.float32) if any(spec.min_p > 0 for spec in sampled)
            else None,
            generators=[(start, n, spec.generator) for spec, start, n in zip(specs, starts, rows_per_spec, strict=True)
                        if n and spec.generator is not None and not spec.greedy],
        )


def sample(logits: torch.Tensor, batch: SamplingBatch, mask_id: int) -> torch.Tensor:
    """[N, V] logits -> [N] int64 tokens, one batched computation (a loop only over seeded requests)."""
    greedy, probs = _distribution(logits, batch, mask_id)
    if probs is None:
        return greedy
    return torch.where(batch.temperature > 0, _race(probs, batch), greedy)


def verify(logits: torch.Tensor, drafts: torch.Tensor, batch: SamplingBatch,
           mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Check one draft token per row against the row's own distribution p (``sample``'s, after
    temperature, top-k and top-p): speculative sampling with the draft as a fixed proposal.

    ``logits`` [R, V]; ``drafts`` [R] int64, -1 where a row has no draft. Returns ``accepted``
    [R] bool and ``tokens`` [R] int64, the row's token (the draft where accepted). Speculative
    sampling with a fixed proposal x keeps x with probability p(x) and otherwise draws from p
    without x, renormalised; a draw y from p, kept as the row's token, with x accepted exactly when
    y == x, has that same law: P(accept) = p(x), and given a rejection y is distributed as
    p(y) / (1 - p(x)) over y != x. So the check costs nothing beyond the row's ordinary draw, which
    the step makes anyway (``accept_drafts``). A greedy row accepts x exactly when x is its argmax.
    """
    tokens = sample(logits, batch, mask_id)
    return accept_drafts(tokens, drafts), tokens


def accept_drafts(tokens: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[R] bool: which drafts ([R] int64, -1 = none) the rows' own draws ``tokens`` ([R]) accept
    (``verify``: a draft is accepted when the row drew it)."""
    return (drafts >= 0) & (tokens == drafts)


def _distribution(logits: torch.Tensor, batch: SamplingBatch, mask_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's argmax [N] and, unless every row is greedy, its distribution [N, V] float32 after
    top-k, top-p, temperature and min-p (rows of temperature 0 get temperature 1: their argmax is used)."""
    logits = logits.to(torch.float32, copy=True)  # one copy, written below (bf16 logits: the float cast is it)
    if batch.ban_mask_token is None:
        logits[:, mask_id] = float("-inf")
    else:
        logits[:, mask_id] = logits[:, mask_id].masked_fill(batch.ban_mask_token, float("-inf"))
    greedy = torch.argmax(logits, dim=-1)
    if batch.temperature is None or not logits.shape[0]:
        return greedy, None
    vocab = logits.shape[-1]
    if batch.top_k is not None:
        k = torch.where((batch.top_k > 0) & (batch.top_k < vocab), batch.top_k, vocab)  # [N]
        kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if batch.top_p is not None:
        logits = logits.masked_fill(_top_p_drop(logits, batch.top_p), float("-inf"))
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0)[:, None]  # [N, 1]
    probs = torch.softmax(logits / temperature, dim=-1)
    if batch.min_p is not None:
        probs = _min_p(probs, batch.min_p)
    return greedy, probs


def _min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """[N, V] probabilities with every entry below ``min_p`` ([N]) times its row's largest set to 0
    (unnormalised: the race does not need it); min_p 0 keeps the row."""
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]  # [N, 1]
    return probs.masked_fill(probs < threshold, 0.0)


def _race(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """[N] one draw per row of ``probs`` [N, V] (unnormalised is fine): the exponential race."""
    race = torch.empty_like(probs).exponential_()  # [N, V]
    for start, count, generator in batch.generators:
        race[start:start + count].exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)


def _top_p_drop(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: entries top-p removes; [N] top_p, 1 keeps everything. A token goes when the
    mass of the tokens ranked before it already exceeds top_p; the top one always stays."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    drop_sorted = (probs.cumsum(-1) - probs) > top_p[:, None]
    drop_sorted[:, 0] = False
    drop_sorted &= (top_p < 1.0)[:, None]
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def sample_request(logits: torch.Tensor, spec: SamplingSpec, mask_id: int) -> torch.Tensor:
    """[n, V] logits of one request -> [n] int64 tokens: ``sample`` written for one request."""
    logits = logits.to(torch.float32, copy=True)
    if spec.ban_mask_token:
        logits[:, mask_id] = float("-inf")
    if spec.greedy:
        return torch.argmax(logits, dim=-1)
    if 0 < spec.top_k < logits.shape[-1]:
        kth = torch.topk(logits, spec.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if spec.top_p < 1.0:
        logits = logits.masked_fill(_top_p_drop(logits, torch.full(logits.shape[:1], spec.top_p)), float("-inf"))
    probs = torch.softmax(logits / spec.temperature, dim=-1)
    if spec.min_p > 0:
        probs = _min_p(probs, torch.full(logits.shape[:1], spec.min_p, device=logits.device))
    race = torch.empty_like(probs).exponential_(generator=spec.generator)
    return (probs / race).argmax(dim=-1)
