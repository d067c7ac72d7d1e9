"""The provenance note (PROVENANCE.md) a WeDLM checkpoint made here carries: where its weights come
from, who to credit, under which license, and what was done to them."""

from __future__ import annotations

from vllm_wedlm.training.conversion.sources import Source


def provenance_note(source: Source, changes: list[str], credit: str | None = None) -> str:
    """PROVENANCE.md of a checkpoint made from ``source`` by ``changes`` (one line each)."""
    lines = ["# Provenance", ""]
    if credit:
        lines += [credit, ""]
    lines += [f"Source: `{source.ref.gguf_file or source.ref.directory.name}` ({_kind(source)})."]
    lines += [f"- {key}: {value}" for key, value in source.provenance.items() if key != "source file"]
    lines += ["", "## What was done", ""]
    lines += [f"- {change}" for change in changes]
    lines += ["", "## License", "", _license_line(source)]
    if source.history:
        lines += ["", "## Earlier provenance of the source", "", source.history.strip()]
    return "\n".join(lines) + "\n"


def _kind(source: Source) -> str:
    container = "a GGUF file, dequantized by transformers" if source.ref.gguf_file else "a transformers directory"
    return f"{source.source_type} causal LM, {container}"


def _license_line(source: Source) -> str:
    if source.license_file is not None:
        return f"The source's license is copied beside this note ({source.license_file.name}); it applies."
    if "license" in source.provenance:
        return (f"The source declares the license `{source.provenance['license']}` (its metadata); "
                "it applies to these weights. The source file ships no license text.")
    if source.history:
        return "See the earlier provenance below."
    return "The source ships no license file: the source's own terms apply."
