"""Can torch 2.14.0 run on the GPU machine's own CUDA libraries? A check by symbols, on the CPU machine.

    python3 scripts/gpukit/check_cuda_symbols.py TORCH_WHEEL DIR [WHEEL ...]

(vLLM 0.33.0 and 0.34.0 both pin torch 2.14.0.) Each further WHEEL (vLLM's) has every shared library
of its own checked the same way.

DIR holds wheels of the CUDA libraries at the machine's versions (gpu-machine-packages.txt), for the
ones whose version differs from what torch pins: nvidia-nccl-cu13 2.28.9, nvidia-cudnn-cu13 9.19.0.56,
nvidia-cublas 13.1.0.3 and nvidia-cusparselt-cu13 0.8.0 (``pip download --no-deps`` them; the others
are the pinned versions already). For every shared library of torch that needs one of them
(``DT_NEEDED``), every symbol it imports (``nm -D --undefined-only``) must be one the library
exports: Python loads torch's libraries with RTLD_NOW, so one missing function fails ``import torch``.
Prints, per library, the imported count and the missing names; exits 1 if any is missing.

What it cannot see: a library that exports a symbol but behaves differently (a minor version's
bug fixes), and torch's own runtime checks (cuDNN's minor version: torch refuses a runtime cuDNN
older than the one it was built with unless PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1, which the
kit's env.sh sets: vLLM's text decoders run no cuDNN kernel).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def symbols(path: Path, defined: bool) -> set[str]:
    """Dynamic symbols of ``path``, without their version tags (``name@LIB``)."""
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}


def needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\).*\[(.+?)\]", out)


def extract(wheel: Path, into: Path, keep) -> None:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if keep(name):
                z.extract(name, into)


def main() -> None:
    torch_wheel, wheel_dir, others = Path(sys.argv[1]), Path(sys.argv[2]), [Path(w) for w in sys.argv[3:]]
    with tempfile.TemporaryDirectory() as tmp:
        libs, torch_dir = Path(tmp) / "libs", Path(tmp) / "torch"
        for wheel in sorted(wheel_dir.glob("*.whl")):
            extract(wheel, libs, lambda n: "/lib/" in n and ".so" in n)
        extract(torch_wheel, torch_dir, lambda n: n.startswith("torch/lib/") and ".so" in n
                or re.match(r"torch/_C\..*\.so$", n))
        for wheel in others:
            extract(wheel, torch_dir, lambda n: n.endswith(".so"))
        exported = {path.name: symbols(path, True) for path in libs.rglob("*.so*")}
        # A symbol of one library's family may come from another of them (libcublas's family
        # includes cublasLt's symbols, which libcublasLt exports): any of them serves.
        everything = set().union(*exported.values())
        missing_any = False
        for library in sorted(torch_dir.rglob("*.so*")):
            imported = symbols(library, False)
            for soname in needed(library):
                if soname not in exported:
                    continue
                # Symbols of this library's family that torch imports (the others come from elsewhere).
                stem = soname.removeprefix("lib").split(".so")[0]
                family = {s for s in imported if s.lower().startswith(stem.lower())}
                missing = sorted(family - everything)
                missing_any |= bool(missing)
                print(f"{library.name} -> {soname}: {len(family)} imported, {len(missing)} missing"
                      + (f": {', '.join(missing)}" if missing else ""))
    sys.exit(1 if missing_any else 0)


if __name__ == "__main__":
    main()
