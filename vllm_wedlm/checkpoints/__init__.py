"""Making WeDLM checkpoints locally (real ones cannot be downloaded here)."""
