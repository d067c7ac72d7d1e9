"""How far into its window each WeDLM step commits: the leading run of every decode forward, per kind.

    python -m benchmarks.commit_runs --model CKPT --kinds humaneval,prose --requests 16 \
        --modes wedlm:0.4,lossless:0.4 --json runs.json

Tokens per forward is the mean of one distribution, the run each forward commits (0 where a plain
step's fills leave its first slot open, up to W). This measures that distribution with the reference
decoder (``vllm_wedlm/reference``: the same decisions as the engine, one request at a time, greedy,
transformers' model on the GPU when there is one) and reports, per kind and mode, the share of
forwards whose run reached each slot of the window (``reach[k-1]``: run >= k), the histogram of run
lengths, and tokens per forward. A model whose mask rows learn more moves ``reach`` up slot by slot
from the second on (the first is the next-token row's in lossless mode, always committed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch


def reach(runs: list[int], window: int) -> list[float]:
    """The share of ``runs`` of at least k tokens, for k = 1 .. ``window``."""
    total = max(len(runs), 1)
    return [round(sum(r >= k for r in runs) / total, 4) for k in range(1, window + 1)]


def measure(decoder, prompts: list[list[int]], params, stop) -> dict:
    """Decode each of ``prompts`` (token ids) with ``decoder``; the run distribution over all of them."""
    runs, tokens = [], 0
    for ids in prompts:
        output = decoder.generate(ids, stop, params)
        runs += output.runs
        tokens += len(output.token_ids)
    return {"requests": len(prompts), "forwards": len(runs), "tokens": tokens,
            "tokens_per_forward": round(tokens / max(len(runs), 1), 3),
            "reach": reach(runs, decoder.window_size),
            "histogram": {str(k): n for k, n in sorted(Counter(runs).items())}}


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from benchmarks import workload
    from benchmarks.modes import parse_modes
    from vllm_wedlm.core.params import DEFAULT_WINDOW_SIZE, WeDLMParams
    from vllm_wedlm.models.configuration_wedlm import WeDLMConfig
    from vllm_wedlm.models.transformers_body import load_transformers_model
    from vllm_wedlm.reference.decoder import ReferenceDecoder, StopRule

    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit_runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a WeDLM checkpoint")
    parser.add_argument("--kinds", default="humaneval,prose", help=f"of {', '.join(workload.ALL_KINDS)}")
    parser.add_argument("--requests", type=int, default=16, help="prompts per kind")
    parser.add_argument("--modes", default="wedlm:0.4,lossless:0.4", help="WeDLM modes (benchmarks/modes.py)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--window-size", type=int, default=DEFAULT_WINDOW_SIZE)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--json", required=True, help="write the results here")
    args = parser.parse_args(argv)

    modes = [m for m in parse_modes(args.modes) if m.windows]
    if not modes:
        parser.error("--modes: no WeDLM mode (ar and wedlm-ar decode one token per forward)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_transformers_model(args.model, getattr(torch, args.dtype)).to(device)
    config = WeDLMConfig.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    decoder = ReferenceDecoder(model, config.mask_token_id, args.window_size)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    stop = StopRule(args.max_tokens, frozenset(t for t in [*eos, tokenizer.eos_token_id] if t is not None))
    kinds = [k for k in args.kinds.split(",") if k]
    prompts = workload.build(tokenizer, kinds, args.requests)
    rows, started = [], time.time()
    for kind in kinds:
        ids = [tokenizer(p.text, add_special_tokens=False).input_ids for p in prompts[kind]]
        for mode in modes:
            params = WeDLMParams(entropy_threshold=mode.entropy_threshold or WeDLMParams().entropy_threshold,
                                 lossless=mode.lossless)
            row = {"kind": kind, "mode": mode.name, **measure(decoder, ids, params, stop)}
            rows.append(row)
            print(f"{kind} {mode.name}: TPF {row['tokens_per_forward']}, reach {row['reach'][:6]}", file=sys.stderr,
                  flush=True)
    command = " ".join(["python -m benchmarks.commit_runs", *(argv or sys.argv[1:])])
    record = {"benchmark": "commit-runs", "command": command,
              "model": args.model, "device": str(device), "dtype": args.dtype, "window_size": args.window_size,
              "max_tokens": args.max_tokens, "seconds": round(time.time() - started, 1), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
