"""Source checkpoints a WeDLM model is made from: a transformers directory or a GGUF file.

Accepted bodies: Qwen2 and Qwen3 (WeDLM-7B's and WeDLM-8B's), Llama-family models (mapped exactly onto
the Qwen2 body: the same layers plus q/k/v biases, which are zero), and WeDLM checkpoints themselves
(already converted). A GGUF file is read by transformers' own GGUF support (the ``gguf`` package),
which dequantizes it; the weights are then copied into a plain transformers model, because the loaded
one keeps a GGUF quantizer that ``save_pretrained`` refuses.

Everything that can be checked from the config is checked before any weight is read
(:func:`inspect_source`); nothing here writes files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from vllm_wedlm.models.configuration_wedlm import MODEL_TYPE, WeDLMConfig

#: Source ``model_type``s, and the WeDLM body each becomes.
BODY_OF_SOURCE = {"llama": "qwen2", "qwen2": "qwen2", "qwen3": "qwen3", MODEL_TYPE: None}
_QWEN = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
#: Files that hold a source directory's license, copied with the model.
LICENSE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "COPYING")
#: The note a converted checkpoint carries about where its weights come from.
PROVENANCE_FILE = "PROVENANCE.md"
#: GGUF metadata that says where a model comes from (general.*), kept in the provenance note.
GGUF_PROVENANCE_KEYS = ("name", "organization", "basename", "finetune", "size_label", "license", "source.url",
                        "repo_url", "url", "author")


class SourceError(ValueError):
    """A source that cannot become a WeDLM model; the message says why."""


@dataclass(frozen=True)
class SourceRef:
    """Where a source lives: a directory, and the GGUF file inside it if it is one."""

    directory: Path
    gguf_file: str | None = None

    @classmethod
    def parse(cls, src: str | Path, gguf: str | None = None) -> SourceRef:
        """``src`` is a directory, or a ``.gguf`` file; ``gguf`` names a GGUF file inside directory ``src``."""
        path = Path(src)
        if gguf is not None:
            gguf_path = Path(gguf) if Path(gguf).is_absolute() else path / gguf
            return cls(gguf_path.parent, gguf_path.name)._checked()
        if path.suffix == ".gguf":
            return cls(path.parent, path.name)._checked()
        return cls(path)._checked()

    def _checked(self) -> SourceRef:
        if self.gguf_file is not None:
            if not (self.directory / self.gguf_file).is_file():
                raise SourceError(f"no GGUF file {self.directory / self.gguf_file}")
        elif not (self.directory / "config.json").is_file():
            raise SourceError(f"{self.directory} is not a model directory (no config.json); for a GGUF file, "
                              "give its path or --gguf FILE")
        return self

    @property
    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def __str__(self) -> str:
        return str(self.directory / self.gguf_file) if self.gguf_file else str(self.directory)


@dataclass
class Source:
    """A source loaded for conversion."""

    ref: SourceRef
    source_type: str  # a key of BODY_OF_SOURCE
    model: PreTrainedModel  # a plain transformers Qwen2ForCausalLM / Qwen3ForCausalLM
    tokenizer: PreTrainedTokenizerBase  # the source's own, as transformers loads it from the source
    mask_token_id: int | None = None  # a WeDLM source's
    provenance: dict[str, str] = field(default_factory=dict)  # what the source says of its origin
    license_file: Path | None = None
    history: str = ""  # a WeDLM source's own provenance note (PROVENANCE.md)


def inspect_source(ref: SourceRef) -> PretrainedConfig:
    """The source's config, if it can become a WeDLM model; raises :class:`SourceError` otherwise."""
    try:
        config = AutoConfig.from_pretrained(ref.directory, **ref.kwargs)
    except (OSError, ValueError, KeyError) as error:
        raise SourceError(f"cannot read the config of {ref}: {error}") from error
    model_type = config.model_type
    if model_type not in BODY_OF_SOURCE:
        raise SourceError(f"model_type {model_type!r} does not convert to WeDLM: the sources are Llama-family, "
                          f"Qwen2 and Qwen3 causal LMs (and WeDLM checkpoints)")
    if model_type == "llama":
        _check_llama(config)
    return config


def _check_llama(config: PretrainedConfig) -> None:
    """A Llama config is exactly a Qwen2 body when what Qwen2 cannot express is absent."""
    problems = []
    if getattr(config, "attention_bias", False):
        problems.append("attention_bias (Qwen2 has no o_proj bias)")
    if getattr(config, "mlp_bias", False):
        problems.append("mlp_bias (Qwen2's MLP has none)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        problems.append(f"head_dim {head_dim} x {config.num_attention_heads} heads != hidden_size "
                        f"{config.hidden_size} (Qwen2 derives head_dim from them)")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        problems.append(f"pretraining_tp {config.pretraining_tp}")
    if problems:
        raise SourceError("this Llama model has no exact Qwen2 form: " + "; ".join(problems))


def qwen2_config_of_llama(config: PretrainedConfig) -> Qwen2Config:
    """The Qwen2 config with a Llama config's hyper-parameters: rope (theta, scaling), tied embeddings
    and ids kept, no sliding window."""
    return Qwen2Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=dict(config.rope_parameters),  # explicit: Qwen2's default theta is 1e6
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=config.num_hidden_layers,
        attention_dropout=config.attention_dropout,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
    )


def plain_qwen_model(loaded: PreTrainedModel, source_type: str, dtype: torch.dtype) -> PreTrainedModel:
    """A plain transformers Qwen2/Qwen3 causal LM with ``loaded``'s weights (a Llama's with zero q/k/v
    biases), in ``dtype``."""
    if source_type == "llama":
        config = qwen2_config_of_llama(loaded.config)
        model_cls = Qwen2ForCausalLM
    else:
        config_cls, model_cls = _QWEN[source_type]
        fields = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
        config = config_cls.from_dict(fields)
    model = model_cls(config).to(dtype)
    state = loaded.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    zero_biases = [name for name in missing if source_type == "llama" and _is_qkv_bias(name)]
    leftover = sorted(set(missing) - set(zero_biases) - _tied_names(model))
    if leftover or unexpected:
        raise SourceError(f"the weights of {source_type} do not map onto {model_cls.__name__}: "
                          f"missing {leftover[:4]}, unexpected {sorted(unexpected)[:4]}")
    with torch.no_grad():
        for name in zero_biases:
            model.get_parameter(name).zero_()
    model.tie_weights()
    return model.eval()


def _is_qkv_bias(name: str) -> bool:
    return name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))


def _tied_names(model: PreTrainedModel) -> set[str]:
    return {"lm_head.weight"} if model.config.tie_word_embeddings else set()


def load_source(ref: SourceRef, dtype: torch.dtype | None = None) -> Source:
    """Load a checked source (see :func:`inspect_source`) as a plain Qwen-body model and its own tokenizer.

    ``dtype`` None keeps the source's (float32 for a GGUF file, which transformers dequantizes).
    """
    config = inspect_source(ref)
    source_type = config.model_type
    tokenizer = AutoTokenizer.from_pretrained(ref.directory, **ref.kwargs)
    if source_type == MODEL_TYPE:
        from vllm_wedlm.models.transformers_body import load_transformers_model

        wedlm_config = WeDLMConfig.from_pretrained(ref.directory)
        model = load_transformers_model(ref.directory, dtype or _dtype_of(wedlm_config))
        note = ref.directory / PROVENANCE_FILE
        return Source(ref, source_type, model, tokenizer, mask_token_id=wedlm_config.mask_token_id,
                      provenance=_note_of_directory(ref.directory), license_file=_license_file(ref.directory),
                      history=note.read_text(encoding="utf-8") if note.is_file() else "")
    loaded = AutoModelForCausalLM.from_pretrained(ref.directory, dtype="auto", **ref.kwargs)
    model = plain_qwen_model(loaded, source_type, dtype or loaded.dtype)
    check_same_logits(loaded, model, probe_ids(tokenizer, config.vocab_size))
    del loaded
    provenance = _gguf_provenance(ref) if ref.gguf_file else _note_of_directory(ref.directory)
    license_file = None if ref.gguf_file else _license_file(ref.directory)
    return Source(ref, source_type, model, tokenizer, provenance=provenance, license_file=license_file)


def _dtype_of(config: PretrainedConfig) -> torch.dtype:
    dtype = getattr(config, "dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


#: A short text whose token ids probe a model (every vocabulary has tokens for it).
PROBE_TEXT = "def add(a, b):\n    return a + b  # 12 + 30 = 42\nThe quiet river reads: 1, 2, 3."


def probe_ids(tokenizer: PreTrainedTokenizerBase, vocab_rows: int) -> torch.Tensor:
    """[1, T] token ids of :data:`PROBE_TEXT` (below ``vocab_rows``), for comparing two models' logits."""
    ids = [i for i in tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids if i < vocab_rows][:48]
    return torch.tensor([ids])


def check_same_logits(expected: PreTrainedModel, actual: PreTrainedModel, ids: torch.Tensor) -> None:
    """Raise :class:`SourceError` unless both models give the same logits on ``ids`` (over
    ``expected``'s vocabulary), to a tolerance fitting ``actual``'s dtype."""
    with torch.no_grad():
        want = expected(ids.to(expected.device)).logits[0].float().cpu()
        got = actual(ids.to(actual.device)).logits[0, :, : want.shape[-1]].float().cpu()
    tolerance = 1e-4 if actual.dtype == torch.float32 else 5e-2
    worst = (want - got).abs().max().item()
    if not worst <= tolerance * max(1.0, want.abs().max().item()):
        raise SourceError(f"the converted model's logits differ from the source's by up to {worst:.3g}")


def _gguf_provenance(ref: SourceRef) -> dict[str, str]:
    """The ``general.*`` metadata of a GGUF file that says where its model comes from."""
    from gguf import GGUFReader

    fields = GGUFReader(ref.directory / ref.gguf_file).fields
    note = {"source file": ref.gguf_file}
    for key in GGUF_PROVENANCE_KEYS:
        entry = fields.get(f"general.{key}")
        if entry is not None:
            note[key] = str(entry.contents())
    return note


def _note_of_directory(directory: Path) -> dict[str, str]:
    return {"source directory": directory.name}


def _license_file(directory: Path) -> Path | None:
    return next((directory / name for name in LICENSE_NAMES if (directory / name).is_file()), None)
