"""Where a decoding step's time goes: cProfile of one batch, engine and worker in this process.

    python -m benchmarks.profile_steps --model DIR --decoding wedlm --batch-size 64 --kind arithmetic

vLLM runs its engine core and (with one GPU) its worker in this process when
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so Python's profiler sees the scheduler, the model runner
(our overrides included) and the points where the CPU waits for the GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--decoding", choices=("ar", "wedlm"), default="wedlm")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--kind", default="arithmetic")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from benchmarks.workload import build, take
    from vllm_wedlm.evaluation import trained_max_number
    from vllm_wedlm.testing import engine_kwargs

    prompts = build(AutoTokenizer.from_pretrained(args.model), [args.kind], args.batch_size, 0,
                    trained_max_number(args.model))[args.kind]
    texts = [p.text for p in take(prompts, args.batch_size)]
    llm = LLM(args.model, additional_config={"decoding": args.decoding}, max_num_seqs=args.batch_size,
              **engine_kwargs(max_model_len=args.max_model_len))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(texts, params, use_tqdm=False)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    outputs = llm.generate(texts, params, use_tqdm=False)
    profiler.disable()
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    print(f"{args.decoding}: {tokens} tokens, {stats.total_tt:.3f} s profiled")
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
