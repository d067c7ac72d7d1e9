"""AR vs WeDLM decoding of the same checkpoint on the same vLLM engine, offline (vllm.LLM).

Runs the same prompts with ``--decoding ar`` and then ``--decoding wedlm`` (one engine at a time,
same settings otherwise) and reports output tokens per second for each and their ratio, measured
in this one run. The WeDLM engine also logs its tokens per forward ("WeDLM decoding: ...").

    python benchmarks/offline_ar_vs_wedlm.py                          # tiny local checkpoint
    python benchmarks/offline_ar_vs_wedlm.py --model PATH --batch-size 8 --max-tokens 256 --json out.json

Greedy, ignore_eos, fixed output length, so both modes produce the same number of tokens. A
tiny random checkpoint shows the engine path works, not real speed: speed needs a trained model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint
from vllm_wedlm.testing import engine_kwargs

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "tiny-wedlm-qwen3-sharp"
PROMPTS = ["1, 2, 3, 4, 5,", "Ada has 12 apples and buys 30 more.", "def double(x):", "The quiet river"]


def run_mode(model: str, decoding: str, args) -> dict:
    from vllm import LLM, SamplingParams

    settings = {"decoding": decoding, "window_size": args.window_size, "entropy_threshold": args.entropy_threshold}
    llm = LLM(model, additional_config=settings, **engine_kwargs(max_model_len=args.max_model_len))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch_size)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.llm_engine.engine_core.shutdown()
    result = {"decoding": decoding, "output_tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}
    print(f"{decoding:>5}: {tokens} tokens in {elapsed:.3f} s = {result['tokens_per_s']:.1f} tok/s", flush=True)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="WeDLM checkpoint (default: a tiny local one)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--window-size", type=int, default=16)
    parser.add_argument("--entropy-threshold", type=float, default=0.4)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        if not (DEFAULT_MODEL_DIR / "model.safetensors").exists():
            make_tiny_checkpoint(DEFAULT_MODEL_DIR, TinySpec(variant="qwen3", logit_scale=30.0))
        model = str(DEFAULT_MODEL_DIR)
    results = {mode: run_mode(model, mode, args) for mode in ("ar", "wedlm")}
    summary = {"model": model, "settings": vars(args), "results": results,
               "wedlm_over_ar": results["wedlm"]["tokens_per_s"] / results["ar"]["tokens_per_s"]}
    print(f"WeDLM / AR throughput, same engine and run: {summary['wedlm_over_ar']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
