"""Turn a pretrained causal LM into a WeDLM checkpoint: Llama-family, Qwen2 or Qwen3, from a transformers
directory or a GGUF file.

A WeDLM model has its base model's weights and layout (research/wedlm.md 1.2); what changes is the
config (``model_type: wedlm``, ``architectures: [WeDLMForCausalLM]``, ``qk_norm``, ``attention_bias``,
``mask_token_id``) and a mask token the tokenizer knows. A Llama-family model becomes the Qwen2 body
(WeDLM-7B's) exactly: the same layers with zero q/k/v biases, rope theta and tied embeddings kept.

* The mask token, when the tokenizer has none, takes a spare embedding row where the matrix has one
  (Qwen's 151,936-row matrices do) and otherwise grows the matrix by exactly one row, initialised to
  the mean of the others. No other row is added: vLLM samples from every row up to ``vocab_size``,
  so padded rows with untrained weights could be drawn at temperature > 0. The mask token itself is
  never drawn in WeDLM mode (core/sampling.py bans it); WeDLM training teaches the model not to
  predict it in AR mode.
* The tokenizer splits text exactly as the source's (tokenizer_io.py), and its chat template is the
  source's: vLLM serves the converted model the prompts the source was trained on.
* Everything is checked before the output exists: the model is written into a staging folder beside
  ``OUT_DIR``, reloaded and compared with the source (logits, token ids on a corpus, chat template),
  and only then moved to ``OUT_DIR``. A refusal leaves nothing behind.
* The source's license file is copied; PROVENANCE.md says where the weights come from.

    python -m vllm_wedlm.training.conversion.convert SRC_DIR OUT_DIR
    python -m vllm_wedlm.training.conversion.convert MODEL.gguf OUT_DIR --credit "..."

To train such a model with WeDLM's objective: ``python -m vllm_wedlm.training OUT_DIR
--from-pretrained SRC`` (train.py).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vllm_wedlm.checkpoints.tiny import CHAT_TEMPLATE, MASK_TOKEN
from vllm_wedlm.models.configuration_wedlm import ARCHITECTURE, AUTO_MAP, BODIES, MODEL_TYPE, WeDLMConfig, body_of
from vllm_wedlm.training.conversion.provenance import provenance_note
from vllm_wedlm.training.conversion.sources import (
    PROVENANCE_FILE,
    Source,
    SourceError,
    SourceRef,
    check_same_logits,
    load_source,
    probe_ids,
)
from vllm_wedlm.training.conversion.tokenizer_io import save_tokenizer, splitting_differences, template_differences

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


#: Keys of every transformers config that say nothing about a causal LM (left out of config.json).
_GENERIC_KEYS = ("_name_or_path", "id2label", "label2id", "problem_type", "chunk_size_feed_forward",
                 "output_attentions", "output_hidden_states", "return_dict", "is_encoder_decoder")


class ConversionError(ValueError):
    """A conversion refused; nothing was written."""


def add_mask_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, mask_token: str = MASK_TOKEN) -> int:
    """Make sure the tokenizer has ``mask_token`` and the model an embedding row for it; its id.

    A new row (the matrix has no spare one) is the mean of the others, in the input embeddings and,
    if untied, in the output ones; the matrix grows by that row alone.
    """
    if mask_token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"mask_token": mask_token})
    mask_id = tokenizer.convert_tokens_to_ids(mask_token)
    rows = model.get_input_embeddings().weight.shape[0]
    if mask_id >= rows:
        model.resize_token_embeddings(mask_id + 1, mean_resizing=False)
        with torch.no_grad():
            for matrix in {id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings())}.values():
                matrix.weight[rows:] = matrix.weight[:rows].mean(dim=0)
    return mask_id


def add_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Give a tokenizer without a chat template (a base model's) the ChatML one of WeDLM's instruct models."""
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE


def wedlm_config(model: PreTrainedModel, mask_token_id: int) -> dict:
    """The published-format WeDLM config.json of a transformers Qwen2/Qwen3 model."""
    model_type = model.config.model_type
    if model_type not in BODIES:
        raise ValueError(f"only Qwen2 and Qwen3 causal LMs convert to WeDLM, not model_type {model_type!r}")
    config = {k: v for k, v in model.config.to_dict().items() if k not in _GENERIC_KEYS}
    # The body fixes the flags that its Qwen config class has no field for (Qwen2: both); a flag the
    # class has (Qwen3's attention_bias) is the model's own, and the written config is checked.
    fields = {field.name for field in dataclasses.fields(model.config)}
    config.update({flag: value for flag, value in BODIES[model_type].items() if flag not in fields})
    config.update(
        architectures=[ARCHITECTURE],
        model_type=MODEL_TYPE,
        auto_map=dict(AUTO_MAP),
        mask_token_id=mask_token_id,
        vocab_size=model.get_input_embeddings().weight.shape[0],
    )
    return dict(sorted(config.items()))


def check_output_dir(out: Path, force: bool = False) -> None:
    """Refuse an output folder that exists and is not empty, unless ``force`` (it is then replaced)."""
    if out.exists() and not out.is_dir():
        raise ConversionError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConversionError(f"{out} exists and is not empty (--force replaces it)")


def save_wedlm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, mask_token_id: int,
               *, source_tokenizer: PreTrainedTokenizerBase | None = None, notes: str = "",
               license_file: Path | None = None, force: bool = False) -> Path:
    """Write model, tokenizer and WeDLM config into ``out_dir``, all or nothing.

    The files go to a staging folder first, which is checked (:func:`verify_checkpoint`; the
    tokenizer against ``source_tokenizer``, default ``tokenizer``) and then renamed to ``out_dir``.
    """
    out = Path(out_dir)
    check_output_dir(out, force)
    add_chat_template(tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        model.save_pretrained(stage)
        save_tokenizer(tokenizer, stage, model.config.max_position_embeddings)
        config = wedlm_config(model, mask_token_id)
        (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if license_file is not None:
            shutil.copyfile(license_file, stage / license_file.name)
        if notes:
            (stage / PROVENANCE_FILE).write_text(notes, encoding="utf-8")
        verify_checkpoint(stage, model, tokenizer, source_tokenizer or tokenizer, mask_token_id)
        stage.chmod(0o755)  # mkdtemp's folder is private
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


def verify_checkpoint(path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                      source_tokenizer: PreTrainedTokenizerBase, mask_token_id: int) -> None:
    """Reload a written checkpoint as transformers (and so vLLM) will, and compare it with what was meant."""
    from vllm_wedlm.models.transformers_body import load_transformers_model

    try:
        config = WeDLMConfig.from_pretrained(path)
        body_of(config)  # raises if the body flags are not a published combination
    except ValueError as error:
        raise ConversionError(f"the written config does not load as a WeDLM config: {error}") from error
    reloaded_tokenizer = AutoTokenizer.from_pretrained(path)
    problems = []
    if config.mask_token_id != mask_token_id or reloaded_tokenizer.convert_tokens_to_ids(MASK_TOKEN) != mask_token_id:
        problems.append(f"the mask token is not id {mask_token_id} in the written config and tokenizer")
    if len(reloaded_tokenizer) > config.vocab_size:
        problems.append(f"the tokenizer has {len(reloaded_tokenizer)} tokens, the model {config.vocab_size} rows")
    if differences := splitting_differences(source_tokenizer, reloaded_tokenizer):
        problems.append(f"the written tokenizer splits {len(differences)} texts differently, e.g. {differences[0]!r}")
    if differences := template_differences(tokenizer, reloaded_tokenizer):
        problems.append(f"the written chat template renders differently: {differences[0]!r}")
    if problems:
        raise ConversionError("; ".join(problems))
    reloaded = load_transformers_model(path, dtype=model.dtype)
    try:
        check_same_logits(model, reloaded, probe_ids(reloaded_tokenizer, config.vocab_size))
    except SourceError as error:
        raise ConversionError(f"the written checkpoint does not reload as the model: {error}") from error


def convert(src: str | Path, out_dir: str | Path, *, gguf: str | None = None, mask_token: str = MASK_TOKEN,
            dtype: torch.dtype | None = None, credit: str | None = None, force: bool = False) -> Path:
    """Convert a Llama-family, Qwen2 or Qwen3 checkpoint (directory or GGUF file) into a WeDLM checkpoint.

    Raises :class:`SourceError` or :class:`ConversionError` (both ``ValueError``) before writing
    anything when the source cannot be converted exactly.
    """
    check_output_dir(Path(out_dir), force)
    source = load_source(SourceRef.parse(src, gguf), dtype)
    source_tokenizer = copy.deepcopy(source.tokenizer)
    rows = source.model.get_input_embeddings().weight.shape[0]
    mask_id = source.mask_token_id if source.mask_token_id is not None else add_mask_token(
        source.model, source.tokenizer, mask_token)
    notes = provenance_note(source, conversion_changes(source, rows, mask_token, mask_id), credit)
    return save_wedlm(source.model, source.tokenizer, out_dir, mask_id, source_tokenizer=source_tokenizer,
                      notes=notes, license_file=source.license_file, force=force)


def conversion_changes(source: Source, rows_before: int, mask_token: str, mask_id: int) -> list[str]:
    """What conversion did to ``source``, for its provenance note."""
    model = source.model
    changes = []
    if source.source_type == "llama":
        changes.append("Llama layers mapped onto the Qwen2 body (WeDLM-7B's): the same weights, zero q/k/v "
                       "biases, rope, tied embeddings and head_dim kept, no sliding window")
    rows = model.get_input_embeddings().weight.shape[0]
    if source.mask_token_id is not None:
        changes.append(f"a WeDLM checkpoint already: mask token id {mask_id} kept")
    elif rows > rows_before:
        changes.append(f"mask token {mask_token} added as id {mask_id}; the embedding matrix grew from {rows_before} "
                       f"to {rows} rows (the new row is the mean of the others)")
    else:
        changes.append(f"mask token {mask_token} is id {mask_id}, a spare row of the {rows}-row embedding matrix")
    changes.append(f"weights stored as {str(model.dtype).removeprefix('torch.')}; otherwise unchanged (the written "
                   "checkpoint's logits were checked against the source's)")
    changes.append("tokenizer: the source's own (same token ids on a test corpus of code, prose, whitespace, "
                   "digits and unicode), with its chat template")
    return changes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert a Llama-family, Qwen2 or Qwen3 causal LM (a transformers directory or a GGUF file) "
                    "into a WeDLM checkpoint.")
    parser.add_argument("src", help="a model directory, or a .gguf file")
    parser.add_argument("out_dir")
    parser.add_argument("--gguf", metavar="FILE", help="a GGUF file inside the directory SRC (or a path to one)")
    parser.add_argument("--mask-token", default=MASK_TOKEN)
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weights' dtype (default: the source's; "
                        "a GGUF file dequantizes to float32)")
    parser.add_argument("--credit", help="a line crediting the model's authors, for PROVENANCE.md")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    args = parser.parse_args(argv)
    try:
        out = convert(args.src, args.out_dir, gguf=args.gguf, mask_token=args.mask_token,
                      dtype=DTYPES.get(args.dtype), credit=args.credit, force=args.force)
    except ValueError as error:
        print(f"convert: refused: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    print(out)


if __name__ == "__main__":
    main()
