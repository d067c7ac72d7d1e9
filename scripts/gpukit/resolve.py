"""Write requirements-cp312.txt: what the vLLM 0.33.0 kit must carry to the GPU machine.

    python3 scripts/gpukit033/resolve.py VLLM_WHEEL [--machine scripts/gpukit033/gpu-machine-packages.txt]

1. vLLM's own requirements (its wheel's ``Requires-Dist``, extras left out), less the packages a
   dense bf16 model on Hopper never loads (``NOT_LOADED``), plus torch 2.14.0, triton 3.8.0 and
   torchvision 0.29.0, resolved by pip for CPython 3.12 on manylinux x86_64 (``pip install --dry-run
   --report``: nothing is installed).
2. Every resolved package that the machine has (its ``pip list --format=freeze``, read there once)
   at a version every resolved requirement on it accepts is left out: the machine's copy serves.
3. The CUDA libraries torch pins are left out too where the machine's copies export every symbol
   torch imports (``check_cuda_symbols.py`` checks it; ``REUSED_CUDA``). NCCL is not among them.

pip evaluates environment markers against the interpreter it runs on, not ``--python-version``, so a
requirement marked for Python above 3.11 is lost when this runs on 3.11: ``MARKED_FOR_312`` puts
those back by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
#: vLLM 0.33.0 requirements whose modules a dense bf16 decoder on an H100/H200 does not import
#: (FlashAttention 3 serves attention; vLLM's own sampler replaces FlashInfer's, as in the 0.26 kit).
NOT_LOADED = {"torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "flashinfer-python",
              "tilelang", "nvidia-cudnn-frontend", "fastsafetensors", "instanttensor", "nvidia-cutlass-dsl",
              "quack-kernels", "tokenspeed-mla", "humming-kernels"}
EXTRA = ["torch==2.14.0", "triton==3.8.0", "torchvision==0.29.0"]
#: torch 2.14.0's pinned CUDA wheels that the machine's older copies stand in for (symbols checked).
REUSED_CUDA = {"cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-cusparselt-cu13"}
#: vLLM requirements marked ``python_version > "3.11"``, which pip drops on a 3.11 interpreter: the
#: one the machine's version fails (setuptools 81.0.0) travels, the other (six) is the machine's.
MARKED_FOR_312 = {"setuptools": "setuptools==80.10.2"}
MACHINE_FOR_312 = ["six==1.17.0"]
PLATFORMS = ([f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 18, 24, 25, 26, 27, 28, 31, 34, 35)]
             + ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any"])
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}


def vllm_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(metadata).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if "extra" in str(requirement.marker or "") or canonicalize_name(requirement.name) in NOT_LOADED:
            continue
        wanted.append(str(requirement))
    return wanted + EXTRA


def resolve(requirements: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        listing, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        listing.write_text("\n".join(requirements) + "\n")
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", *platforms, "--target", str(Path(tmp) / "t"), "-r", str(listing)],
                       check=True)
        return json.loads(report.read_text())["install"]


def split(installs: list[dict], requirements: list[str], machine: dict[str, str]) -> tuple[list[str], list[str]]:
    """``name==version`` of every resolved package the kit carries (the machine lacks it at an
    accepted version), and of every one it leaves to the machine, at the machine's version."""
    wanted: dict[str, list] = {}  # name -> every specifier on it, from the resolved set and the top level
    for item in installs:
        extras = [""] + list(item.get("requested_extras") or [])
        for text in item["metadata"].get("requires_dist") or []:
            requirement = Requirement(text)
            if requirement.marker and not any(requirement.marker.evaluate({**ENV, "extra": e}) for e in extras):
                continue
            wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement.specifier)
    for text in requirements:
        requirement = Requirement(text)
        if not requirement.marker or requirement.marker.evaluate(ENV):
            wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement.specifier)
    carry, reuse = [], []
    for item in installs:
        name, version = canonicalize_name(item["metadata"]["name"]), item["metadata"]["version"]
        have = machine.get(name)
        if name in MARKED_FOR_312:
            continue
        if name in REUSED_CUDA or (have is not None and all(Version(have) in spec for spec in wanted.get(name, []))):
            reuse.append(f"{name}=={have}")
        else:
            carry.append(f"{name}=={version}")
    return sorted(carry + list(MARKED_FOR_312.values())), sorted(reuse + MACHINE_FOR_312)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm_wheel", type=Path)
    parser.add_argument("--machine", type=Path, default=HERE / "gpu-machine-packages.txt")
    parser.add_argument("--out", type=Path, default=HERE / "requirements-cp312.txt")
    parser.add_argument("--reused", type=Path, default=HERE / "machine-reused-cp312.txt",
                        help="where to write what is left to the machine (check_imports.sh installs it)")
    args = parser.parse_args()
    machine = {canonicalize_name(n): v for n, _, v in
               (line.strip().partition("==") for line in args.machine.read_text().splitlines()) if v}
    requirements = vllm_requirements(args.vllm_wheel)
    carry, reuse = split(resolve(requirements), requirements, machine)
    for path, lines in ((args.out, carry), (args.reused, reuse)):
        header = [line for line in path.read_text().splitlines() if line.startswith("#")] if path.exists() else []
        path.write_text("\n".join(header + lines) + "\n")
    print(f"{len(carry)} packages to carry ({args.out}), {len(reuse)} left to the machine ({args.reused})")


if __name__ == "__main__":
    main()
