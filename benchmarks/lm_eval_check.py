"""lm-eval, a peer's harness, drives WeDLM servers through its OpenAI-compatible client.

Two tasks on local data, held-out word problems of the model's own training distribution: one of
multiple choice, scored by log-likelihood (the reference answer up to its last sum's "=", then four
results; lm-eval's ``local-completions`` sends each with ``echo`` and ``logprobs`` and reads the
result's log-probs: ``acc`` is whether the right one is the likeliest), and one generated until the
end of the turn and scored by the final number it states (``exact_match``). The same tasks
run against ``--decoding ar``, ``--decoding wedlm --wedlm-lossless`` (whose requests are lossless by
default: lm-eval sends no ``vllm_xargs``) and, generation only, plain ``--decoding wedlm`` (which
cannot return log-probs). Lossless must score exactly as AR does, sample for sample.

    python -m benchmarks.lm_eval_check [--model DIR] [--limit N] [--output FILE]

Needs lm-eval (``pip install "lm-eval[api]==0.4.13"``); on a CPU, the served model is the trained
micro model by default.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.evaluation import trained_max_number
from vllm_wedlm.server_process import running_server

LOGLIKELIHOOD_TASK = "wedlm_answers_choice"
GENERATION_TASK = "wedlm_answers_generate"
SERVERS = {"ar": ["--decoding", "ar"], "lossless": ["--decoding", "wedlm", "--wedlm-lossless"],
           "wedlm": ["--decoding", "wedlm"]}
CPU_ARGS = ["--max-model-len", "512", "--kv-cache-memory-bytes", str(256 * 2**20), "--dtype", "float32"]


def write_tasks(model: str, directory: Path, count: int) -> None:
    """The two task definitions and their data (JSON lines) in ``directory``."""
    from transformers import AutoTokenizer

    from vllm_wedlm.training.data.tasks import chat_prompt, generate

    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = generate("arithmetic", "test", count, seed=7, max_number=trained_max_number(model))
    rows = []
    for task in tasks:
        # Multiple choice: the reference answer up to its last sum's "=", then four results.
        cut = task.response.rindex(" = ") + len(" =")
        answer, question = int(task.answer), chat_prompt(tokenizer, task)
        rows.append({"question": question, "context": question + task.response[:cut],
                     "choices": [f" {n}" for n in (answer, answer + 1, answer - 1, answer + 10)],
                     "answer": task.answer})
    data = directory / "answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (directory / f"{LOGLIKELIHOOD_TASK}.yaml").write_text(
        f"task: {LOGLIKELIHOOD_TASK}\n{common}output_type: multiple_choice\ndoc_to_text: \"{{{{context}}}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: 0\ntarget_delimiter: \"\"\n"
        "metric_list:\n  - metric: acc\n")
    (directory / f"{GENERATION_TASK}.yaml").write_text(
        f"task: {GENERATION_TASK}\n{common}output_type: generate_until\ndoc_to_text: \"{{{{question}}}}\"\n"
        "doc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"<|im_end|>\"]\n  max_gen_toks: 96\n  do_sample: false\n"
        "  temperature: 0.0\nfilter_list:\n  - name: answer\n    filter:\n"
        "      - function: regex\n        regex_pattern: \"The answer is (-?[0-9]+)\"\n"
        "      - function: take_first\nmetric_list:\n  - metric: exact_match\n")


def evaluate(url: str, model: str, tasks: list[str], include: Path, limit: int | None) -> dict:
    """lm-eval's scores and per-sample records of ``tasks`` against the server at ``url``."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    served = json.loads(__import__("requests").get(f"{url}/v1/models", timeout=30).text)["data"][0]["id"]
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"base_url": f"{url}/v1/completions", "model": served, "tokenizer": model,
                    "tokenizer_backend": "huggingface", "num_concurrent": 4, "max_retries": 1,
                    "tokenized_requests": True},
        tasks=tasks, task_manager=TaskManager(include_path=str(include)), limit=limit, log_samples=True)
    scores = {task: {k: v for k, v in values.items() if isinstance(v, int | float)}
              for task, values in results["results"].items()}
    samples = {task: [{"doc_id": s["doc_id"], "resps": s["resps"], "filtered_resps": s["filtered_resps"]}
                      for s in sorted(records, key=lambda s: s["doc_id"])]
               for task, records in results["samples"].items()}
    return {"scores": scores, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MICRO_CHECKPOINT))
    parser.add_argument("--count", type=int, default=64, help="held-out problems written")
    parser.add_argument("--limit", type=int, default=None, help="problems scored (lm-eval's --limit)")
    parser.add_argument("--serve-arg", action="append", default=None,
                        help="extra vllm serve arguments (default, on a CPU: " + " ".join(CPU_ARGS) + ")")
    parser.add_argument("--output", type=Path, default=None, help="write the scores and samples as JSON")
    args = parser.parse_args(argv)
    extra = CPU_ARGS if args.serve_arg is None else args.serve_arg
    work = Path(tempfile.mkdtemp(prefix="wedlm-lm-eval-"))
    write_tasks(args.model, work, args.count)
    runs = {}
    for name, decoding in SERVERS.items():
        tasks = [GENERATION_TASK] if name == "wedlm" else [LOGLIKELIHOOD_TASK, GENERATION_TASK]
        with running_server(args.model, *decoding, *extra, log_path=work / f"serve-{name}.log") as url:
            runs[name] = evaluate(url, args.model, tasks, work, args.limit)
        print(name, json.dumps(runs[name]["scores"]), flush=True)
    same = runs["lossless"] == runs["ar"]
    print("lossless scores and samples equal AR's:", same)
    if args.output:
        args.output.write_text(json.dumps({"model": args.model, "count": args.count, "limit": args.limit,
                                           "serve_args": extra, "lossless_equals_ar": same, "runs": runs},
                                          indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
