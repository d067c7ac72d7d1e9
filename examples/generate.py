"""The same WeDLM model, the same vLLM engine build: AR one token per forward vs WeDLM, side by side.

With no --model it uses the trained micro model shipped in the package
(``vllm_wedlm/checkpoints/micro``) on five held-out word problems it never saw in training. Each
prompt is generated alone (batch 1), first with ``--decoding ar``, then with ``--decoding wedlm``;
for each answer: whether it is right, tokens, forwards, tokens per forward, time; then both modes'
totals and the WeDLM / AR ratio. With --log-file (scripts/demo.sh) the engines' log lines go to
that file and the terminal shows a progress line, then the table.

    python examples/generate.py                                   # the shipped micro model
    python examples/generate.py --modes wedlm --entropy-threshold 0.8
    python examples/generate.py --model /path/to/WeDLM-8B-Instruct --prompt "Count from 1 to 30."

The shipped model runs with the test engines' small settings (512 tokens of context, a small KV
cache; eager on a CPU). A model given with --model gets vLLM's own defaults on a GPU (its full
context, 90% of GPU memory) unless --max-model-len / --gpu-memory-utilization say otherwise; on a
CPU it keeps the small KV cache, since vLLM's CPU default reserves most of the machine's memory.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.config import DECODING_MODES
from vllm_wedlm.engine_settings import engine_kwargs, on_gpu
from vllm_wedlm.evaluation import held_out_tasks, is_correct, request_forwards, trained_max_number
from vllm_wedlm.training.data.tasks import Task

MODE_NAMES = {"ar": "AR", "wedlm": "WeDLM"}


@dataclass
class Answer:
    text: str
    tokens: int
    forwards: int
    seconds: float
    correct: bool | None


def default_tasks(model: str) -> list[Task]:
    """Five held-out word problems in the model's own number range (the shipped model's task; it
    has not learned counting well: vllm_wedlm/checkpoints/micro/README.md)."""
    return held_out_tasks(5, ("arithmetic",), seed=7, max_number=trained_max_number(model))["arithmetic"]


def run_mode(model: str, decoding: str, tasks: list[Task], args, progress: Callable[[str], None]) -> list[Answer]:
    """One engine in one decoding mode; each task generated alone (batch 1), greedy."""
    from vllm import LLM, SamplingParams

    progress(f"{MODE_NAMES[decoding]}: starting the engine")
    settings = {"decoding": decoding, "entropy_threshold": args.entropy_threshold}
    if args.window_size is not None:  # else the engine's default: the adaptive window
        settings["window_size"] = args.window_size
    llm = LLM(model, additional_config=settings, **engine_settings(model, args))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.chat([tasks[0].messages(with_response=False)], params, use_tqdm=False)  # warm-up, not timed
    answers = []
    try:
        for number, task in enumerate(tasks, 1):
            progress(f"{MODE_NAMES[decoding]}: prompt {number} of {len(tasks)}")
            before = request_forwards(llm) if decoding == "wedlm" else 0
            start = time.perf_counter()
            out = llm.chat([task.messages(with_response=False)], params, use_tqdm=False)[0].outputs[0]
            seconds = time.perf_counter() - start
            tokens = len(out.token_ids)
            forwards = request_forwards(llm) - before if decoding == "wedlm" else tokens
            correct = is_correct(task, out.text) if task.kind else None
            answers.append(Answer(out.text, tokens, forwards, seconds, correct))
    finally:
        llm.llm_engine.engine_core.shutdown()
    return answers


def engine_settings(model: str, args) -> dict:
    """``vllm.LLM`` keyword arguments: the small test settings for the shipped model, vLLM's
    defaults on a GPU for any other (CPU: the small KV cache), then the command line's."""
    kwargs = engine_kwargs()
    if model != str(MICRO_CHECKPOINT):
        kwargs.pop("max_model_len")
        if on_gpu():
            kwargs.pop("gpu_memory_utilization", None)
    if args.max_model_len is not None:
        kwargs["max_model_len"] = args.max_model_len
    if args.gpu_memory_utilization is not None:
        kwargs.pop("kv_cache_memory_bytes", None)
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    return kwargs


def send_logs_to(path: Path) -> TextIO:
    """Send everything this process and its engine processes write to stdout and stderr (vLLM's log
    lines, warnings, progress bars) to ``path``; return a stream onto the terminal for the table.

    It works on the file descriptors, which the engine's processes inherit, so their output goes
    to the file too; vLLM's own log handler keeps writing to ``sys.stdout``, now the file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    with open(path, "w") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
    return terminal


def progress_line(out: TextIO) -> Callable[[str], None]:
    """One line that rewrites itself on a terminal (a plain line each time elsewhere)."""
    if not out.isatty():
        return lambda text: print(f"... {text}", file=out)
    return lambda text: out.write(f"\r\033[K... {text}" if text else "\r\033[K")


def verdict(answer: Answer) -> str:
    return {True: "right", False: "WRONG", None: "     "}[answer.correct]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(MICRO_CHECKPOINT),
                        help="a WeDLM checkpoint directory (default: the shipped micro model)")
    parser.add_argument("--modes", default="ar,wedlm", help=f"comma-separated, of {', '.join(DECODING_MODES)}")
    parser.add_argument("--prompt", action="append", help="a user message (repeatable; default: held-out tasks)")
    parser.add_argument("--window-size", type=int,
                        help="a fixed W for WeDLM (default: the engine's, the adaptive window at most 16)")
    parser.add_argument("--entropy-threshold", type=float, default=0.4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, help="default: 512 for the shipped model, else the model's")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        help="default: 0.3 for the shipped model, else vLLM's (0.9)")
    parser.add_argument("--log-file", type=Path,
                        help="write the engines' log lines to this file instead of the terminal")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if any(mode not in DECODING_MODES for mode in modes):
        parser.error(f"--modes: each of {', '.join(DECODING_MODES)}")

    tasks = [Task("", p, "") for p in args.prompt] if args.prompt else default_tasks(args.model)
    out = send_logs_to(args.log_file) if args.log_file else sys.stdout
    progress = progress_line(out) if args.log_file else (lambda text: None)
    results = {mode: run_mode(args.model, mode, tasks, args, progress) for mode in modes}
    progress("")
    report(args, tasks, modes, results, out)
    if args.log_file:
        print(f"\nthe engines' log: {args.log_file}", file=out)


def report(args, tasks: list[Task], modes: list[str], results: dict[str, list[Answer]], out: TextIO) -> None:
    """Each prompt's answers side by side, then the totals and the WeDLM / AR ratio."""
    say = functools.partial(print, file=out)
    window = "adaptive (at most 16)" if args.window_size is None else args.window_size
    say(f"\nmodel {args.model}\nwindow {window}, entropy threshold {args.entropy_threshold}, "
          "greedy, one request at a time\n")
    for i, task in enumerate(tasks):
        say(f">>> {task.prompt}" + (f"   (answer: {task.answer or task.response})" if task.kind else ""))
        for mode in modes:
            a = results[mode][i]
            text = " / ".join(line.strip() for line in a.text.strip().splitlines())
            say(f"  {MODE_NAMES[mode]:<6}{verdict(a)}  {a.tokens:3d} tokens in {a.forwards:3d} forwards "
                  f"({a.tokens / max(a.forwards, 1):4.1f} per forward), {a.seconds:5.2f} s:  {text}")
        say()
    say(f"{'':8}{'right':>7}{'tokens':>8}{'forwards':>10}{'per forward':>13}{'tok/s':>8}")
    speed = {}
    for mode in modes:
        answers = results[mode]
        tokens, forwards = sum(a.tokens for a in answers), sum(a.forwards for a in answers)
        speed[mode] = tokens / sum(a.seconds for a in answers)
        scored = [a for a in answers if a.correct is not None]
        right = f"{sum(a.correct for a in scored)}/{len(scored)}" if scored else "-"
        say(f"{MODE_NAMES[mode]:<8}{right:>7}{tokens:>8}{forwards:>10}{tokens / max(forwards, 1):>13.2f}"
              f"{speed[mode]:>8.1f}")
    if len(speed) == 2:
        say(f"\nWeDLM / AR: {speed['wedlm'] / speed['ar']:.2f}x the tokens per second, "
              "same weights, same engine build")


if __name__ == "__main__":
    main()
