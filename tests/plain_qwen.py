"""A plain Qwen3 checkpoint (not a WeDLM model): a tiny WeDLM checkpoint's weights under Qwen3's
own config, for tests of what the plugin must leave alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def plain_qwen3_copy(wedlm_checkpoint: Path, out: Path) -> Path:
    """Copy a Qwen3-style WeDLM checkpoint to ``out`` as ``Qwen3ForCausalLM``; no remote code."""
    shutil.copytree(wedlm_checkpoint, out, ignore=shutil.ignore_patterns("*.py"))
    config = json.loads((out / "config.json").read_text())
    assert config["qk_norm"] and not config["attention_bias"], "a Qwen3-style (qk_norm) checkpoint is needed"
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    for key in ("auto_map", "qk_norm", "mask_token_id"):
        config.pop(key)
    (out / "config.json").write_text(json.dumps(config))
    return out
