"""Pearson's chi-square goodness-of-fit test (scipy is not a dependency; torch has the gamma function)."""

from __future__ import annotations

import torch


def chi_square_p_value(observed, expected) -> float:
    """P(a chi-square variable with len - 1 degrees of freedom >= the statistic of these counts)."""
    observed = torch.as_tensor(observed, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor(len(observed) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))
