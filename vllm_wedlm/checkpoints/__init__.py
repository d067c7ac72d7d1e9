"""Making WeDLM checkpoints locally (real ones cannot be downloaded here), and one trained one.

``MICRO_CHECKPOINT``: the ``micro`` recipe (training/recipes.py), trained once and shipped with its
training record (``training.json``) and its held-out evaluation (``evaluation.json``); see the
README beside it. The demo's default model, and what the WeDLM-speed tests measure.
"""

from pathlib import Path

MICRO_CHECKPOINT = Path(__file__).resolve().parent / "micro"
