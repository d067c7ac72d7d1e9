"""The device work of a step of plain windows, as one function that torch.compile can fuse.

A step whose logits rows are all mask rows of plain windows (no prefill ending, no lossless or AR
request) does the same thing every time: entropy of each mask row, fills, commit, refill and the
next physical order (``core.batch``), then the packet the host copies back. Run eagerly that is
about 110 small kernels, each paying the host's launch overhead: about 1 ms per step on the H100's
host at any batch size, for a model whose forward takes less than the GPU's 0.5 ms (BENCHMARKS
5.4). The GPU worker compiles ``plain_window_step`` when vLLM compiles the model (not with
``--enforce-eager``), which fuses it into a few kernels (0.2-0.4 ms). It only composes ``core``'s
functions, which the reference decoder runs eagerly; the CPU runs it eagerly too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from vllm.logger import init_logger

from vllm_wedlm.adapter.window_table import WindowTable, window_packet
from vllm_wedlm.core.batch import WindowBatch, finish_windows, leading_filled, plan_windows
from vllm_wedlm.core.selection import row_entropy

logger = init_logger("vllm.wedlm")


def plain_window_step(table: WindowBatch, slots: torch.Tensor, logits: torch.Tensor, tokens: torch.Tensor,
                      entropy_threshold: torch.Tensor, pos_penalty: torch.Tensor, committed_len: torch.Tensor,
                      window_size: int, limit: int, mask_id: int) -> tuple[torch.Tensor, ...]:
    """Finish the windows at ``slots`` ([B] int64) of ``table`` ([S, C], the planned windows) and
    plan their next forward; the next windows' tokens, filled and length, and their packet ([B, ...]).

    ``logits`` [N, V] / ``tokens`` [N] int64: the mask rows of the B windows, window by window, and
    each one's draw; ``entropy_threshold`` / ``pos_penalty`` [S] per slot; ``committed_len`` [B]:
    tokens before each next window. Returns plain tensors (a compiled function's outputs)."""
    planned = table.rows(slots)
    following = finish_windows(planned, leading_filled(planned.filled), row_entropy(logits), tokens,
                               entropy_threshold[slots], pos_penalty[slots], mask_id)
    plan = plan_windows(following, window_size, committed_len, limit)
    return plan.windows.tokens, plan.windows.filled, plan.windows.length, window_packet(plan)


def compiled_window_step(table: WindowTable, logits_like: torch.Tensor, window_size: int, limit: int) -> Callable:
    """``plain_window_step`` compiled, its variants compiled now rather than in a request's step.

    Sizes 1 are specialised by torch.compile: one window or one mask row compiles apart from
    larger batches, so both are run here once, on the live table (the function writes nothing).
    ``logits_like``: a logits row of the model (its dtype)."""
    start = time.perf_counter()
    step = torch.compile(plain_window_step, dynamic=True)
    device = logits_like.device
    slots_available = len(table.pos_penalty)
    for windows, masks in ((1, 1), (1, 2), (2, 1)):
        if windows > slots_available:
            continue
        rows = windows * masks
        step(table.windows, torch.arange(windows, device=device), logits_like[:1].expand(rows, -1).contiguous(),
             torch.zeros(rows, dtype=torch.long, device=device), table.entropy_threshold, table.pos_penalty,
             torch.zeros(windows, dtype=torch.long, device=device), window_size, limit, table.mask_id)
    torch.cuda.synchronize(device)
    logger.info("WeDLM: compiled the window step in %.1f s", time.perf_counter() - start)

    def run(*args):
        # A variant not compiled above runs eagerly rather than compiling inside a request's step
        # (seconds: an H100 run showed two such stalls at batch 1 before this).
        with torch.compiler.set_stance("eager_on_recompile"):
            return step(*args)

    return run
