"""Stock vLLM's AR decoding step on the Qwen3-8B shape, for any vLLM version (issue 45's comparison).

    VLLM_PLUGINS= python3 scripts/gpukit/ar_step_cost.py --json OUT.json [--batch-sizes 1,16,64]

Run it under the 0.26.0 kit and under the 0.33.0 kit on the same GPU machine: it imports nothing of
this project (so the plugin's code never meets a vLLM it was not written for) and needs no tokenizer.
The model is a plain Qwen3ForCausalLM config of Qwen3-8B's sizes with random weights
(``load_format="dummy"``), bf16, vLLM's defaults otherwise (CUDA graphs, its default runner and
scheduling). A step's time is that of two runs of ``--lengths`` output tokens (``ignore_eos``),
differenced, so prefill and start-up cancel, as ``benchmarks step-cost`` times it: per batch size,
the median of ``--repeats`` and their spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

#: Qwen3-8B's published sizes (the body of WeDLM-8B).
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645}


#: A few-MB model of the same kind, for a check of this script on a CPU (``--tiny``).
TINY = {**QWEN3_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024, "max_position_embeddings": 2048,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--lengths", default="128,384", help="the two output lengths whose difference is timed")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--tiny", action="store_true", help="a tiny model instead (a check of the script on a CPU)")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    n1, n2 = (int(n) for n in args.lengths.split(","))

    import numpy as np
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    shape = TINY if args.tiny else QWEN3_8B
    model = Path(tempfile.mkdtemp()) / "qwen3-shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(shape))
    start = time.perf_counter()
    llm = LLM(str(model), load_format="dummy", skip_tokenizer_init=True, dtype=shape["torch_dtype"], seed=0,
              max_model_len=args.prompt_tokens + n2 + 16, max_num_seqs=max(batch_sizes),
              gpu_memory_utilization=0.1 if args.tiny else args.gpu_memory_utilization)  # CPU: a share of its RAM
    started = time.perf_counter() - start
    rng = np.random.default_rng(0)

    def run(prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        begin = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - begin

    rows = []
    for batch in batch_sizes:
        prompts = rng.integers(0, 1000, (batch, args.prompt_tokens)).tolist()
        run(prompts, 16)  # warm-up
        steps = [(run(prompts, n2) - run(prompts, n1)) / (n2 - n1) * 1e3 for _ in range(args.repeats)]
        rows.append({"batch_size": batch, "step_ms": round(statistics.median(steps), 3),
                     "step_ms_spread": [round(min(steps), 3), round(max(steps), 3)],
                     "tok_s": round(batch * 1e3 / statistics.median(steps), 1)})
        print(f"batch {batch}: {rows[-1]['step_ms']} ms a step {rows[-1]['step_ms_spread']}", flush=True)
    config = llm.llm_engine.vllm_config
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    record = {"vllm": vllm.__version__, "torch": torch.__version__, "device": device, "tiny": args.tiny,
              "engine_start_s": round(started, 1),
              "cudagraph_mode": str(getattr(config.compilation_config.cudagraph_mode, "name", None)),
              "async_scheduling": bool(config.scheduler_config.async_scheduling),
              "lengths": [n1, n2], "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "rows": rows}
    Path(args.json).write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
