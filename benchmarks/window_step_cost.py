"""The device work of a step of plain windows, eager against compiled (GPU): host ms per step.

    python -m benchmarks.window_step_cost --json window-step-cost.json

What the runner does after the forward of a step whose rows are all plain windows' mask rows:
greedy draws (eager), ``adapter.window_step.plain_window_step`` (entropy, fills, commit, refill,
packet; eager or torch.compile'd as the GPU worker does) and the packet's one device-to-host copy;
the table's store (three index writes) is left out, so every repeat steps the same windows. Random
bf16 logits, W 16, for a small and a Qwen3-sized vocabulary.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from vllm_wedlm.adapter.window_step import compiled_window_step, plain_window_step, plan_rows
from vllm_wedlm.adapter.window_table import WindowTable
from vllm_wedlm.core.batch import WindowBatch, plan_windows
from vllm_wedlm.core.params import WeDLMParams
from vllm_wedlm.core.sampling import SamplingBatch, sample

MASK_ID, LIMIT = 5, 1024


def _time(step, table: WindowTable, batch: int, logits: torch.Tensor, window_size: int, repeats: int) -> dict:
    device = logits.device
    with torch.inference_mode():
        slots, committed = plan_rows(np.arange(batch), np.full(batch, 100), device)

    @torch.inference_mode()  # as the runner's step runs, which the compiled function's guards check
    def run(copy: bool):
        tokens = sample(logits, SamplingBatch(None, None, None, None), MASK_ID)
        *following, packet = step(table.windows, slots, logits, tokens, table.entropy_threshold, table.pos_penalty,
                                  committed, window_size, LIMIT, MASK_ID)
        return packet.cpu() if copy else packet

    planned = table.windows.rows(slots)  # the same planned windows every repeat (the store is left out)
    for _ in range(5):
        run(True)
    result = {}
    for name, copy in (("ms_per_step", True), ("ms_launch_only", False)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            run(copy)
        result[name] = round((time.perf_counter() - start) / repeats * 1e3, 3)
    torch.cuda.synchronize()
    assert torch.equal(table.windows.rows(slots).tokens, planned.tokens)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab-sizes", default="2000,151936")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--window-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    w = args.window_size
    rows = []
    for vocab in (int(v) for v in args.vocab_sizes.split(",")):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            table = WindowTable(2 * w, MASK_ID, device, slots=batch)
            for slot in range(batch):
                table.set_params(slot, WeDLMParams())  # tau 0.4, lambda 0.02
            plan = plan_windows(WindowBatch.empty(batch, 2 * w, MASK_ID, device), w,
                                torch.zeros(batch, dtype=torch.long, device=device), None)
            table.windows.store(torch.arange(batch, device=device), plan.windows)  # W masks each
            generator = torch.Generator(device=device).manual_seed(0)
            with torch.inference_mode():  # a step's tensors are made in it (vLLM's execute_model)
                logits = 3 * torch.randn(batch * w, vocab, device=device, dtype=torch.bfloat16, generator=generator)
            eager = _time(plain_window_step, table, batch, logits, w, args.repeats)

            def logits_of_rows(rows: int, vocab=vocab) -> torch.Tensor:  # fresh rows, as the step's logits
                return torch.randn(rows, vocab, device=device, dtype=torch.bfloat16)

            compiled = _time(compiled_window_step(table, logits_of_rows, (w,), LIMIT), table, batch, logits, w,
                             args.repeats)
            row = {"vocab": vocab, "batch": batch, "mask_rows": batch * w, "eager": eager, "compiled": compiled}
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "window-step-cost", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
