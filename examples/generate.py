"""Generate with a WeDLM checkpoint through vllm.LLM, with the plugin's decoding mode.

With no --model, a tiny WeDLM checkpoint is made locally first (random weights with a sharpened
output layer, so the text is gibberish but some masks are confident: the point is the whole path,
from the published checkpoint format to parallel decoding in vLLM's engine).

    python examples/generate.py                              # tiny local model, --decoding wedlm
    python examples/generate.py --decoding ar                # the same weights, one token per forward
    python examples/generate.py --model /path/to/WeDLM-8B-Instruct --entropy-threshold 0.6
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from vllm_wedlm.checkpoints.tiny import TinySpec, make_tiny_checkpoint
from vllm_wedlm.config import DECODING_MODES
from vllm_wedlm.testing import engine_kwargs

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "tiny-wedlm-qwen3-sharp"
QUESTIONS = [
    "Count from 1 to 20.",
    "Ada has 12 apples and buys 30 more. How many apples does she have?",
    "Write a Python function that doubles a number.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a WeDLM checkpoint directory (default: a tiny local one)")
    parser.add_argument("--decoding", choices=DECODING_MODES, default="wedlm")
    parser.add_argument("--window-size", type=int, default=16)
    parser.add_argument("--entropy-threshold", type=float, default=0.4)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    model = args.model
    if model is None:
        if not (DEFAULT_MODEL_DIR / "model.safetensors").exists():
            make_tiny_checkpoint(DEFAULT_MODEL_DIR, TinySpec(variant="qwen3", logit_scale=30.0))
        model = str(DEFAULT_MODEL_DIR)

    from vllm import LLM, SamplingParams

    settings = {"decoding": args.decoding, "window_size": args.window_size,
                "entropy_threshold": args.entropy_threshold}
    llm = LLM(model, additional_config=settings, **engine_kwargs())
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    start = time.perf_counter()
    outputs = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    for question, out in zip(QUESTIONS, outputs):
        print(f"\n>>> {question}\n{out.outputs[0].text!r}  [{len(out.outputs[0].token_ids)} tokens]")
    print(f"\nmodel {model} | decoding {args.decoding} | {num_tokens} tokens in {elapsed:.2f} s")
    llm.llm_engine.engine_core.shutdown()  # WeDLM mode logs its tokens per forward on the way out


if __name__ == "__main__":
    main()
