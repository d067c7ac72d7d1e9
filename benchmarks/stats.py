"""Summaries of measured requests and ratios to AR within one run."""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 99)


def percentiles(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    points = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)
    return {f"{prefix}_p{p}": round(float(v), 5) for p, v in zip(PERCENTILES, points, strict=True)}


def accuracy(verdicts: list[bool | None]) -> float | None:
    scored = [v for v in verdicts if v is not None]
    return sum(scored) / len(scored) if scored else None


#: Columns that identify one measured setting apart from the mode.
SETTING_KEYS = ("kind", "batch_size", "concurrency", "shots", "max_tokens", "structured")


def add_ratios_to_ar(rows: list[dict]) -> list[dict]:
    """``speedup_vs_ar``: a row's output tok/s over the AR row of the same setting in the same run."""
    ar = {tuple(r.get(k) for k in SETTING_KEYS): r for r in rows if r["mode"] == "ar"}
    for row in rows:
        base = ar.get(tuple(row.get(k) for k in SETTING_KEYS))
        if base and base["output_tok_s"] > 0:
            row["speedup_vs_ar"] = round(row["output_tok_s"] / base["output_tok_s"], 3)
    return rows
