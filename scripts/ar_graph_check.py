"""AR-decoded requests on a WeDLM engine against an AR engine, by batch size and CUDA graph mode (GPU).

    python scripts/ar_graph_check.py --model /tmp/small --out ar-steps.json [--configs default,eager,piecewise]

Greedy ``wedlm_decoding: ar`` requests on a ``--decoding wedlm`` engine must give the AR engine's
tokens. For each engine configuration and batch size (1 to 64 arithmetic prompts of the benchmark
workload, max_tokens 256), it records how many requests differ from the AR engine's and the first
token where each of the first five does, and the steps run per graph mode. Found that a FULL graph
of a step of AR requests alone gave wrong tokens (lab notebook 5.13).

The ``v1-full`` and ``v1-full-and-piecewise`` configurations leave the plugin's WeDLM runner out:
an AR engine on vLLM's own V1 runner with that graph mode. On an H100 (bf16, FlashAttention 3)
``v1-full`` gave every request of a batch of 8 or more a wrong token within its first nine, as the
WeDLM engine did before it moved FlashAttention's schedule into the graph; so the fault is vLLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from unittest.mock import patch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmarks package, as scripts/graph_parity.py does

CONFIGS = {"default": {}, "eager": {"enforce_eager": True},
           "piecewise": {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
           "v1-full": {"compilation_config": {"cudagraph_mode": "FULL"}},
           "v1-full-and-piecewise": {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}}
V1_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's switch; "0" for the engines of the v1-* configurations
BATCH_SIZES = (1, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from benchmarks import workload

    prompts = [p.text for p in workload.build(AutoTokenizer.from_pretrained(args.model), ["arithmetic"],
                                              max(BATCH_SIZES))["arithmetic"]]
    common = {"max_model_len": 1024, "gpu_memory_utilization": 0.25, "max_num_batched_tokens": 8192,
              "max_num_seqs": 64}

    def generate(llm, batch: int, extra_args=None) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=256, extra_args=extra_args)
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:batch], params, use_tqdm=False)]

    llm = LLM(args.model, additional_config={"decoding": "ar"}, **common)
    expected = {batch: generate(llm, batch) for batch in BATCH_SIZES}
    llm.llm_engine.engine_core.shutdown()
    del llm
    results = {}
    for name in args.configs.split(","):
        vllm_alone = name.startswith("v1-")
        decoding = {"decoding": "ar"} if vllm_alone else {"decoding": "wedlm", "window_size": 16}
        # vLLM reads the switch when the engine is configured, and its process inherits it.
        with patch.dict(os.environ, {V1_RUNNER_ENV: "0"} if vllm_alone else {}):
            llm = LLM(args.model, additional_config=decoding, **common, **CONFIGS[name])
        result = {}
        for batch in BATCH_SIZES:
            got = generate(llm, batch, None if vllm_alone else {"wedlm_decoding": "ar"})
            differ = [i for i in range(batch) if got[i] != expected[batch][i]]
            # -1: one is a prefix of the other (a different length only)
            first = [next((k for k, (a, b) in enumerate(zip(got[i], expected[batch][i], strict=False)) if a != b), -1)
                     for i in differ[:5]]
            result[batch] = {"differ": len(differ), "first_diff_at": first}
        if not vllm_alone:
            result["graph_modes"] = llm.collective_rpc("wedlm_graph_modes")[0]
        results[name if vllm_alone else f"wedlm-{name}"] = result
        print(name, json.dumps(result), flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
