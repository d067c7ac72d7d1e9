"""Write requirements-vllm0YY-cp312.txt: what the kit of vLLM 0.YY.0 must carry to the GPU machine.

    python3 scripts/gpukit/resolve.py VLLM_WHEEL [--machine scripts/gpukit/gpu-machine-packages.txt]

The version comes from the wheel (0.33.0 writes requirements-vllm033-cp312.txt and
machine-reused-vllm033-cp312.txt beside this file, 0.34.0 the 034 pair).

1. vLLM's own requirements (its wheel's ``Requires-Dist``, extras left out; torch and torchvision at
   its pins, triton at torch's), less the packages a dense bf16 model on Hopper never loads
   (``NOT_LOADED``), resolved by pip for CPython 3.12 on manylinux x86_64 (``pip install --dry-run
   --report``: nothing is installed).
2. Every resolved package that the machine has (its ``pip list --format=freeze``, read there once)
   at a version every resolved requirement on it accepts is left out: the machine's copy serves.
3. The CUDA libraries torch pins are left out too where the machine's copies export every symbol
   torch imports (``check_cuda_symbols.py`` checks it; ``REUSED_CUDA``). NCCL is not among them.

pip evaluates environment markers against the interpreter it runs on, not ``--python-version``, so a
requirement marked for Python above 3.11 is lost when this runs on 3.11: ``MARKED_FOR_312`` puts
those back by hand, and a marked requirement it does not name stops the script.
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
#: vLLM 0.33.0's and 0.34.0's requirements whose modules a dense bf16 decoder on an H100/H200 does not
#: import (FlashAttention 3 serves attention; vLLM's own sampler replaces FlashInfer's, as in the 0.26 kit).
NOT_LOADED = {"torchaudio", "torchcodec", "pynvvideocodec", "flashinfer-python",
              "tilelang", "nvidia-cudnn-frontend", "fastsafetensors", "instanttensor", "nvidia-cutlass-dsl",
              "quack-kernels", "tokenspeed-mla", "humming-kernels"}
#: torch 2.14.0's pinned CUDA wheels (0.33.0 and 0.34.0 pin that torch) that the machine's older
#: copies stand in for (symbols checked).
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


def wheel_metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(metadata).decode().splitlines()


def kit_tag(wheel: Path) -> str:
    """``034`` for vLLM 0.34.0: the name of its files here."""
    version = next(line.split(":", 1)[1].strip() for line in wheel_metadata(wheel) if line.startswith("Version:"))
    return f"{Version(version).major}{Version(version).minor:02d}"


def vllm_requirements(wheel: Path) -> list[str]:
    wanted = []
    for line in wheel_metadata(wheel):
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        name = canonicalize_name(requirement.name)
        if "extra" in str(requirement.marker or "") or name in NOT_LOADED:
            continue
        if (requirement.marker and requirement.marker.evaluate(ENV) != requirement.marker.evaluate()
                and name not in MARKED_FOR_312 and not any(m.startswith(f"{name}==") for m in MACHINE_FOR_312)):
            raise SystemExit(f"{requirement}: pip on Python {sys.version.split()[0]} would judge its marker "
                             "otherwise than for 3.12; name it in MARKED_FOR_312 or MACHINE_FOR_312")
        wanted.append(str(requirement))
    return wanted


def resolve(requirements: list[str], deps: bool = True) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        listing, report = Path(tmp) / "requirements.txt", Path(tmp) / "report.json"
        listing.write_text("\n".join(requirements) + "\n")
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", *platforms, "--target", str(Path(tmp) / "t"), "-r", str(listing),
                        *([] if deps else ["--no-deps"])],
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


def reuse_only_consistent(carry: list[str], reuse: list[str], installs: list[dict]) -> tuple[list[str], list[str]]:
    """Step 2's other side: a machine package whose own requirements the kit's versions break travels
    at its resolved version instead (vLLM 0.34.0 wants huggingface-hub >= 2; the machine's transformers
    5.17.0, which 0.34.0 accepts, wants it below 2, and transformers checks that on import)."""
    resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    carried = dict(line.split("==") for line in carry)
    reused = dict(line.split("==") for line in reuse)
    # The requirements of the machine's versions (the resolved ones' are met by construction).
    own = {canonicalize_name(i["metadata"]["name"]): i["metadata"].get("requires_dist") or []
           for i in resolve([f"{n}=={v}" for n, v in reused.items() if n not in REUSED_CUDA], deps=False)}
    moved = True
    while moved:
        moved = False
        present = {**reused, **carried}
        for name in sorted(reused):
            broken = [str(r) for r in map(Requirement, own.get(name, [])) if canonicalize_name(r.name) in present
                      and (not r.marker or r.marker.evaluate(ENV))
                      and Version(present[canonicalize_name(r.name)]) not in r.specifier]
            if broken:
                print(f"{name} {reused[name]} (the machine's) wants {', '.join(broken)}: "
                      f"{name} {resolved[name]} travels")
                carried[name] = resolved[name]
                del reused[name]
                moved = True
                break
    return (sorted(f"{n}=={v}" for n, v in carried.items()), sorted(f"{n}=={v}" for n, v in reused.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm_wheel", type=Path)
    parser.add_argument("--machine", type=Path, default=HERE / "gpu-machine-packages.txt")
    parser.add_argument("--out", type=Path, help="default: requirements-vllm0YY-cp312.txt here")
    parser.add_argument("--reused", type=Path, help="where to write what is left to the machine (check_imports.sh "
                        "installs it); default: machine-reused-vllm0YY-cp312.txt here")
    args = parser.parse_args()
    tag = kit_tag(args.vllm_wheel)
    args.out = args.out or HERE / f"requirements-vllm{tag}-cp312.txt"
    args.reused = args.reused or HERE / f"machine-reused-vllm{tag}-cp312.txt"
    machine = {canonicalize_name(n): v for n, _, v in
               (line.strip().partition("==") for line in args.machine.read_text().splitlines()) if v}
    requirements = vllm_requirements(args.vllm_wheel)
    installs = resolve(requirements)
    carry, reuse = reuse_only_consistent(*split(installs, requirements, machine), installs)
    for path, lines in ((args.out, carry), (args.reused, reuse)):
        header = [line for line in path.read_text().splitlines() if line.startswith("#")] if path.exists() else []
        path.write_text("\n".join(header + lines) + "\n")
    print(f"{len(carry)} packages to carry ({args.out}), {len(reuse)} left to the machine ({args.reused})")


if __name__ == "__main__":
    main()
