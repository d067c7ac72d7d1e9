"""Train a WeDLM model: from scratch (a recipe's shapes) or from a pretrained AR model.

    python -m vllm_wedlm.training OUT_DIR --recipe micro            # a GPU: 3 minutes, a CPU: 20
    python -m vllm_wedlm.training OUT_DIR --recipe small            # one GPU, under ten minutes
    python -m vllm_wedlm.training OUT_DIR --from-pretrained SRC --steps 2000
    python -m vllm_wedlm.training OUT_DIR --recipe smollm2 --from-pretrained CONVERTED --data CHATS.jsonl
    torchrun --nproc-per-node 4 -m vllm_wedlm.training OUT_DIR --recipe small   # data parallel, 4 GPUs

``--from-pretrained`` takes what convert.py takes (a Llama-family, Qwen2 or Qwen3 directory or GGUF
file) or a WeDLM checkpoint; the source's own tokenizer and chat template are kept. ``--data`` trains
on a chat data file (chat_data.py; e.g. distill.py's self-distillation) instead of the task mixture.

The result is a WeDLM checkpoint in the published format, ready for
``vllm serve OUT_DIR --decoding wedlm``. Progress (losses, throughput, time left) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerBase

from vllm_wedlm.checkpoints.tiny import (
    MASK_TOKEN,
    chat_tokenizer,
    config_for,
    random_model,
    train_bpe_tokenizer,
    write_checkpoint,
)
from vllm_wedlm.training.conversion.convert import DTYPES, add_chat_template, add_mask_token, save_wedlm
from vllm_wedlm.training.conversion.provenance import provenance_note
from vllm_wedlm.training.conversion.sources import SourceRef, load_source
from vllm_wedlm.training.data.chat_data import read_chats
from vllm_wedlm.training.data.tasks import KINDS, Task, chat_prompt, mixture
from vllm_wedlm.training.distributed import (
    ONE_PROCESS,
    Ranks,
    any_rank,
    backward_step,
    data_parallel,
    finish,
    pick_device,
    start,
    sum_over_ranks,
)
from vllm_wedlm.training.objective import collate
from vllm_wedlm.training.recipes import MLM_WEIGHTINGS, RECIPES, Recipe


@dataclass(frozen=True)
class Vocabulary:
    """What training needs of a tokenizer."""

    encode: Callable[[str], list[int]]
    prompt: Callable[[Task], str]  # the chat up to the assistant's answer (see chat_prompt)
    mask_token_id: int
    pad_token_id: int
    im_end_id: int

    @classmethod
    def of_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, mask_token: str = MASK_TOKEN) -> Vocabulary:
        """The vocabulary of a tokenizer with a chat template, ``mask_token`` and ChatML's ``<|im_end|>``."""
        return cls(
            encode=lambda text: tokenizer(text, add_special_tokens=False).input_ids,
            prompt=lambda task: chat_prompt(tokenizer, task),
            mask_token_id=tokenizer.convert_tokens_to_ids(mask_token),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            im_end_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        )


def chat_bpe_tokenizer(tasks: list[Task], vocab_target: int) -> Tokenizer:
    """A byte-level BPE tokenizer (digits split) learned from the chats of ``tasks``, as the ChatML
    template of the tiny checkpoints renders them: a from-scratch model's tokenizer."""
    # Rendering takes the template alone: an empty tokenizer carrying it renders the chats before
    # there is a vocabulary.
    template = chat_tokenizer(Tokenizer(models.BPE()))
    texts = [chat_prompt(template, task) + task.response + "<|im_end|>" for task in tasks]
    return train_bpe_tokenizer(texts, vocab_target, split_digits=True)


def tokenize(task: Task, vocab: Vocabulary, recipe: Recipe) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(ids [L], maskable [L]) of one chat: the prompt is never masked and carries no loss."""
    prompt = vocab.encode(vocab.prompt(task))
    # An answer cut by a length limit did not end there: no end-of-turn tokens to learn after it.
    answer = vocab.encode(task.response) + [vocab.im_end_id] * (recipe.learnable_im_end if task.finished else 0)
    if len(prompt) + recipe.learnable_im_end + 8 > recipe.max_length:
        return None
    answer = answer[: recipe.max_length - len(prompt)]
    ids = torch.tensor(prompt + answer, dtype=torch.long)
    maskable = torch.cat([torch.zeros(len(prompt), dtype=torch.bool), torch.ones(len(answer), dtype=torch.bool)])
    return ids, maskable


def training_samples(tasks: list[Task], vocab: Vocabulary, recipe: Recipe) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The tokenised chats of one epoch, each kind repeated as ``recipe.oversample`` says."""
    samples = []
    for task in tasks:
        sample = tokenize(task, vocab, recipe)
        if sample is not None:
            samples.extend([sample] * recipe.oversample.get(task.kind, 1))
    return samples


def learning_rate(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(
    model: torch.nn.Module,
    samples: list[tuple[torch.Tensor, torch.Tensor]],
    vocab: Vocabulary,
    recipe: Recipe,
    *,
    device: torch.device,
    ranks: Ranks = ONE_PROCESS,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    log_every: int = 20,
) -> list[dict]:
    """Run ``recipe.steps`` optimiser steps (fewer if ``recipe.time_limit_s`` runs out); return the
    logged history. Under torchrun (``ranks``: several processes), each process trains on its share
    of every batch and DistributedDataParallel averages the gradients (distributed.py)."""
    if recipe.batch_size % ranks.world_size:
        raise ValueError(f"a batch of {recipe.batch_size} chats does not split over {ranks.world_size} processes")
    if not ranks.main:
        log = lambda line: None  # noqa: E731  (rank 0 speaks for all)
    model.to(device).train()
    forward = data_parallel(model, recipe.ar_weight, recipe.mlm_weighting, ranks)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.learning_rate,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    generator = torch.Generator().manual_seed(recipe.seed)
    order = random.Random(recipe.seed)
    queue: list[int] = []
    # bf16 autocast on a GPU, unless the recipe's model is float32 (the micro model: the GPU then
    # trains it in the same precision as the CPU does).
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and recipe.model.dtype != "float32"
    )
    history, start, tokens_seen = [], time.perf_counter(), 0
    running = {"total": 0.0, "mlm": 0.0, "ar": 0.0}
    for step in range(recipe.steps):
        if len(queue) < recipe.batch_size:
            epoch = list(range(len(samples)))
            order.shuffle(epoch)
            queue.extend(epoch)
        picked = [samples[queue.pop()] for _ in range(recipe.batch_size)]
        # Every process collates the whole batch (same generator, same masks) and trains on its share.
        batch = collate(
            picked,
            block_size=recipe.block_size,
            mask_token_id=vocab.mask_token_id,
            pad_token_id=vocab.pad_token_id,
            generator=generator,
            suffix_prob=recipe.suffix_mask_prob,
        )
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        optimizer.zero_grad(set_to_none=True)
        losses = backward_step(forward, batch, recipe.mlm_weighting, ranks, device, autocast)  # [3]: total, mlm, ar
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens_seen += batch.input_ids.numel()
        for name, value in zip(running, sum_over_ranks(losses, ranks).tolist(), strict=True):
            running[name] += value
        elapsed = time.perf_counter() - start
        out_of_time = any_rank(recipe.time_limit_s is not None and elapsed > recipe.time_limit_s, ranks, device)
        if (step + 1) % log_every == 0 or step + 1 == recipe.steps or out_of_time:
            count = (step % log_every) + 1
            entry = {name: value / count for name, value in running.items()}
            entry.update(step=step + 1, seconds=round(elapsed, 1), lr=learning_rate(recipe, step))
            history.append(entry)
            eta = elapsed / (step + 1) * (recipe.steps - step - 1)
            log(f"step {step + 1}/{recipe.steps}  loss {entry['total']:.3f}  mlm {entry['mlm']:.3f}  "
                f"ar {entry['ar']:.3f}  lr {entry['lr']:.2e}  {tokens_seen / elapsed:,.0f} tok/s  "
                f"{elapsed:.0f}s elapsed, ~{eta:.0f}s left")
            running = dict.fromkeys(running, 0.0)
        if out_of_time:
            log(f"stopping after {step + 1} of {recipe.steps} steps: the time limit of {recipe.time_limit_s:.0f}s "
                "is spent (the learning rate had not decayed to its end)")
            break
    return history


def training_tasks(recipe: Recipe, data: list[str] | None = None) -> list[Task]:
    """The chats of chat data files if any are given (in file order, then shuffled), else the recipe's
    task mixture."""
    if not data:
        return mixture(recipe.task_counts, "train", recipe.seed, recipe.max_number)
    tasks = [task for path in data for task in read_chats(path)]
    random.Random(f"{recipe.seed}/data").shuffle(tasks)
    return tasks


def train_from_scratch(out_dir: str | Path, recipe: Recipe, device: torch.device | None = None,
                       data: list[str] | None = None, ranks: Ranks = ONE_PROCESS) -> Path | None:
    """Train ``recipe`` from random weights and write a WeDLM checkpoint into ``out_dir`` (rank 0's
    path; the other data-parallel processes write nothing and get None)."""
    device = device or pick_device(None)  # one process
    torch.manual_seed(recipe.seed)
    tasks = training_tasks(recipe, data)
    tokenizer = chat_bpe_tokenizer(tasks, recipe.vocab_target)
    vocab = Vocabulary.of_tokenizer(chat_tokenizer(tokenizer))
    samples = training_samples(tasks, vocab, recipe)
    model = random_model(recipe.model, config_for(recipe.model, tokenizer))
    history = _train_announced(model, recipe.name, samples, vocab, recipe, device, ranks)
    if history is None:
        return None
    out = write_checkpoint(out_dir, tokenizer, recipe.model, model.float())
    _write_training_record(out, recipe, history, device, ranks)
    return out


def train_from_pretrained(src: str | Path, out_dir: str | Path, recipe: Recipe, device: torch.device,
                          data: list[str] | None = None, gguf: str | None = None,
                          ranks: Ranks = ONE_PROCESS) -> Path | None:
    """Fine-tune a pretrained AR model (what convert.py takes, or a WeDLM checkpoint) with WeDLM's
    objective on chat data files or the task mixture; save it as a WeDLM checkpoint in the recipe's dtype.

    The source's tokenizer is used as the source loads it (its own splitting), and prompts are
    rendered with its chat template, as vLLM renders them when it serves the result.
    """
    source = load_source(SourceRef.parse(src, gguf), torch.float32)
    model, tokenizer = source.model, source.tokenizer
    rows_before = model.get_input_embeddings().weight.shape[0]
    mask_id = source.mask_token_id if source.mask_token_id is not None else add_mask_token(model, tokenizer)
    if "<|im_end|>" not in tokenizer.get_vocab():
        raise ValueError("the tokenizer has no <|im_end|>; WeDLM's instruct format is ChatML")
    add_chat_template(tokenizer)  # only if the source has none: the template the checkpoint is saved with
    tasks = training_tasks(recipe, data)
    vocab = Vocabulary.of_tokenizer(tokenizer)
    samples = training_samples(tasks, vocab, recipe)
    history = _train_announced(model, f"{recipe.name} from {src}", samples, vocab, recipe, device, ranks)
    if history is None:
        return None
    model = model.to("cpu", DTYPES[recipe.model.dtype])
    steps = history[-1]["step"] if history else 0
    changes = [f"trained with WeDLM's dual-stream objective by vllm_wedlm.training (recipe {recipe.name}): {steps} "
               f"steps of {recipe.batch_size} chats on {_devices(device, ranks)}",
               "data: " + (", ".join(Path(d).name for d in data) if data else f"the task mixture {recipe.task_counts}"),
               f"weights stored as {recipe.model.dtype}"]
    if source.mask_token_id is None:
        changes.insert(0, f"mask token added as id {mask_id} ({rows_before} embedding rows before)")
    out = save_wedlm(model, tokenizer, out_dir, mask_id, notes=provenance_note(source, changes),
                     license_file=source.license_file, force=True)
    _write_training_record(out, recipe, history, device, ranks)
    return out


def _train_announced(model: torch.nn.Module, what: str, samples: list[tuple[torch.Tensor, torch.Tensor]],
                     vocab: Vocabulary, recipe: Recipe, device: torch.device, ranks: Ranks) -> list[dict] | None:
    """Say what trains (rank 0), train it; the logged history on rank 0, None on the other processes."""
    if ranks.main:
        parameters = sum(p.numel() for p in model.parameters())
        print(f"training {what}: {parameters / 1e6:.2f}M parameters, {len(samples)} chats, {recipe.steps} steps "
              f"of {recipe.batch_size}, on {_devices(device, ranks)}", file=sys.stderr, flush=True)
    history = train(model, samples, vocab, recipe, device=device, ranks=ranks)
    return history if ranks.main else None


def _devices(device: torch.device, ranks: Ranks) -> str:
    """What trains, for logs and records: one device, or the data-parallel processes'."""
    return device_name(device) + (f", x{ranks.world_size} data-parallel processes" if ranks.world_size > 1 else "")


def device_name(device: torch.device) -> str:
    """What trained a model, for its record: kernels differ between machines, and so do weights."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def _write_training_record(out: Path, recipe: Recipe, history: list[dict], device: torch.device,
                           ranks: Ranks = ONE_PROCESS) -> None:
    record = {"recipe": asdict(recipe), "history": history,
              "trained_on": {"device": device_name(device), "processes": ranks.world_size,
                             "torch": torch.__version__}}
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def _counts_per_kind(text: str, option: str) -> dict[str, int]:
    """``counting=4000,arithmetic=16000`` -> {"counting": 4000, "arithmetic": 16000}."""
    counts = {}
    for part in text.split(","):
        kind, _, count = part.partition("=")
        if kind.strip() not in KINDS or not count.strip().isdigit():
            raise SystemExit(f"{option}: expected KIND=N with KIND in {', '.join(KINDS)}, got {part!r}")
        counts[kind.strip()] = int(count)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train a WeDLM model (dual-stream masking).")
    parser.add_argument("out_dir")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="micro")
    parser.add_argument("--from-pretrained", metavar="SRC",
                        help="start from this pretrained causal LM (Llama-family, Qwen2, Qwen3 or WeDLM; a directory "
                             "or a .gguf file) instead of random weights")
    parser.add_argument("--gguf", metavar="FILE", help="a GGUF file inside the --from-pretrained directory")
    parser.add_argument("--data", metavar="FILE", action="append",
                        help="train on this chat data file (JSON lines, see chat_data.py; repeatable) instead of the "
                             "recipe's task mixture")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="stop training after this long (the checkpoint is still written)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-number", type=int, help="bound on the numbers of counting and arithmetic tasks")
    parser.add_argument("--tasks", metavar="KIND=N,...",
                        help="training tasks per kind, e.g. counting=4000,arithmetic=16000")
    parser.add_argument("--oversample", metavar="KIND=N,...", help="repeat each chat of a kind N times per epoch")
    parser.add_argument("--ar-weight", type=float, help="weight w of the auxiliary AR loss: (mlm + w * ar) / (1 + w)")
    parser.add_argument("--mlm-weighting", choices=MLM_WEIGHTINGS, help="weights of masked rows in the MLM loss")
    parser.add_argument("--suffix-mask-prob", type=float,
                        help="chance that a block masks a contiguous tail instead of a random subset")
    parser.add_argument("--num-layers", type=int, help="layers of a model trained from scratch")
    parser.add_argument("--hidden-size", type=int, help="width of a model trained from scratch (MLP: 3x)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    args = parser.parse_args(argv)
    recipe = RECIPES[args.recipe].with_overrides(
        steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
        block_size=args.block_size, seed=args.seed, max_number=args.max_number,
        task_counts=_counts_per_kind(args.tasks, "--tasks") if args.tasks else None,
        oversample=_counts_per_kind(args.oversample, "--oversample") if args.oversample else None,
        ar_weight=args.ar_weight, mlm_weighting=args.mlm_weighting, suffix_mask_prob=args.suffix_mask_prob,
        time_limit_s=args.time_limit,
    )
    if args.num_layers or args.hidden_size:
        model = recipe.model
        width = args.hidden_size or model.hidden_size
        recipe = recipe.with_overrides(model=replace(
            model, num_hidden_layers=args.num_layers or model.num_hidden_layers,
            hidden_size=width, intermediate_size=3 * width if args.hidden_size else model.intermediate_size,
        ))
    ranks, device = start(args.device)  # under torchrun: this process's rank and GPU
    if args.from_pretrained:
        out = train_from_pretrained(args.from_pretrained, args.out_dir, recipe, device, args.data, args.gguf, ranks)
    else:
        out = train_from_scratch(args.out_dir, recipe, device, args.data, ranks)
    finish(ranks)
    if out is not None:
        print(out)
