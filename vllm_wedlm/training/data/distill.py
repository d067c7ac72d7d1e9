"""Self-distillation data: a model's own autoregressive answers to many prompts, as chat data.

    python -m vllm_wedlm.training.data.distill MODEL OUT.jsonl --prompts 6000
    python -m vllm_wedlm.training.data.distill MODEL OUT.jsonl --mix arithmetic=2000,prose=500 --temperature 0.7

The prompts are prompts.py's (the task generator's kinds and open-ended prompts built from the
standard library's docstrings; train split unless ``--split test``), rendered with the model's own
chat template exactly as training renders them, and answered by the model in vLLM with ``decoding:
ar`` (one token per forward; greedy unless ``--temperature``). Answers cut by ``--max-tokens`` are
kept, marked ``"finished": false``: training learns their tokens but no end of turn after them (it
would teach the model to stop there); empty answers are left out. Each record carries its
provenance: the model, the prompt's kind and source, the sampling and the engine. Progress and time
left go to stderr; the file appears when the run is complete (OUT.jsonl.partial until then).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vllm_wedlm.training.conversion.sources import PROVENANCE_FILE
from vllm_wedlm.training.data.chat_data import chat_record, write_chats
from vllm_wedlm.training.data.prompts import DISTILL_KINDS, Prompt, prompt_mixture
from vllm_wedlm.training.data.tasks import Task, chat_prompt

#: Prompts per kind when only a total is given: mostly open-ended text, where a pretrained model's
#: answers are its own (the scored kinds are a minority).
DEFAULT_SHARES = {"counting": 1, "arithmetic": 2, "code": 1, "prose": 1, "question": 2, "summary": 1,
                  "explain": 1, "continue": 1}


def counts_for(total: int, shares: dict[str, int] = DEFAULT_SHARES) -> dict[str, int]:
    """``total`` prompts split over kinds in proportion to ``shares``."""
    weight = sum(shares.values())
    counts = {kind: total * share // weight for kind, share in shares.items()}
    counts[next(iter(counts))] += total - sum(counts.values())
    return counts


def model_credit(model: str) -> str | None:
    """The first line of a checkpoint's PROVENANCE.md under its title: who made the weights."""
    note = Path(model) / PROVENANCE_FILE
    if not note.is_file():
        return None
    lines = [line.strip() for line in note.read_text(encoding="utf-8").splitlines()]
    return next((line for line in lines[1:] if line and not line.startswith("#")), None)


def distill(model: str, out: str | Path, counts: dict[str, int], *, split: str = "train", seed: int = 0,
            temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 256,
            engine_overrides: dict | None = None, shard: tuple[int, int] = (0, 1)) -> dict:
    """Answer ``counts`` prompts per kind with ``model`` (AR, in vLLM); write chat data to ``out``. A summary.

    ``shard`` (i, n): only every n-th prompt of the mixture from the i-th on, so that n processes (one
    per GPU) answer the whole mixture between them, each into its own file."""
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}: expected 0 <= i < n")
    from vllm import LLM

    from vllm_wedlm.engine_settings import engine_kwargs

    overrides = {"max_model_len": 1024, "seed": seed, **(engine_overrides or {})}
    llm = LLM(model, additional_config={"decoding": "ar"}, **engine_kwargs(**overrides))
    try:
        return distill_with(llm, prompt_mixture(counts, split, seed)[index::count], out, model=model, split=split,
                            temperature=temperature, top_p=top_p, max_tokens=max_tokens, engine_seed=seed)
    finally:
        llm.llm_engine.engine_core.shutdown()


def distill_with(llm, prompts: list[Prompt], out: str | Path, *, model: str, split: str = "train",
                 temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 256, engine_seed: int | None = None,
                 chunk: int = 512, log=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Answer ``prompts`` with a running AR ``vllm.LLM`` of ``model``; write chat data to ``out``. A summary."""
    from vllm import SamplingParams

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("")  # the run starts afresh
    sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "engine_seed": engine_seed}
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    tokenizer = llm.get_tokenizer()
    base = {"model": Path(model).name, "model_credit": model_credit(model), "decoding": "ar",
            "engine": f"vllm {_vllm_version()}", "sampling": sampling, "split": split}
    summary = {"prompts": len(prompts), "written": 0, "truncated": 0, "empty": 0, "output_tokens": 0}
    start = time.perf_counter()
    for first in range(0, len(prompts), chunk):
        batch = prompts[first:first + chunk]
        inputs = [{"prompt_token_ids": tokenizer(chat_prompt(tokenizer, Task(p.kind, p.text, "")),
                                                 add_special_tokens=False).input_ids} for p in batch]
        outputs = llm.generate(inputs, params, use_tqdm=False)
        records = []
        for prompt, output in zip(batch, outputs, strict=True):
            answer = output.outputs[0]
            summary["output_tokens"] += len(answer.token_ids)
            if not answer.text.strip():
                summary["empty"] += 1
                continue
            # An answer cut by max_tokens is kept (marked unfinished): most long answers are the
            # richest text, and dropping them skewed the data towards short ones.
            finished = answer.finish_reason == "stop"
            summary["truncated"] += not finished
            records.append(chat_record(prompt.kind, prompt.text, answer.text, _provenance(base, prompt, answer),
                                       finished=finished))
        summary["written"] += write_chats(partial, records)
        done, elapsed = first + len(batch), time.perf_counter() - start
        log(f"distill {done}/{len(prompts)} prompts  {summary['written']} chats kept  "
            f"{summary['output_tokens'] / elapsed:,.0f} tok/s  {elapsed:.0f}s elapsed, "
            f"~{elapsed / done * (len(prompts) - done):.0f}s left")
    partial.replace(out)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    return summary


def _provenance(base: dict, prompt: Prompt, answer) -> dict:
    return {**base, "prompt_kind": prompt.kind, "prompt_source": prompt.source,
            "output_tokens": len(answer.token_ids), "finish_reason": answer.finish_reason}


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def parse_counts(text: str) -> dict[str, int]:
    """``arithmetic=2000,prose=500`` -> {"arithmetic": 2000, "prose": 500}."""
    counts = {}
    for part in text.split(","):
        kind, _, count = part.partition("=")
        if kind.strip() not in DISTILL_KINDS or not count.strip().isdigit():
            raise SystemExit(f"--mix: expected KIND=N with KIND in {', '.join(DISTILL_KINDS)}, got {part!r}")
        counts[kind.strip()] = int(count)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Self-distillation chat data: a model's own AR answers, in vLLM.")
    parser.add_argument("model", help="a checkpoint vLLM serves (e.g. a converted WeDLM checkpoint)")
    parser.add_argument("out", help="the chat data file to write (JSON lines)")
    parser.add_argument("--prompts", type=int, default=4000, help="prompts in all, over the default mix of kinds")
    parser.add_argument("--mix", metavar="KIND=N,...", help=f"prompts per kind instead ({', '.join(DISTILL_KINDS)})")
    parser.add_argument("--split", choices=("train", "test"), default="train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--dtype", help="the engine's dtype (default: vLLM's choice for the checkpoint)")
    args = parser.parse_args(argv)
    counts = parse_counts(args.mix) if args.mix else counts_for(args.prompts)
    overrides = {"max_model_len": args.max_model_len}
    if args.gpu_memory_utilization:
        overrides["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.dtype:
        overrides["dtype"] = args.dtype
    summary = distill(args.model, args.out, counts, split=args.split, seed=args.seed, temperature=args.temperature,
                      top_p=args.top_p, max_tokens=args.max_tokens, engine_overrides=overrides)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
