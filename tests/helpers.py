"""Shared test helpers: error norms, random problems, tolerance rules."""

from __future__ import annotations

import numpy as np


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64 (0 for two empty or two all-zero arrays)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    num = float(np.linalg.norm((got - want).ravel()))
    den = float(np.linalg.norm(want.ravel()))
    return num / den if den else num


def feasible(src, kernel, dilations, pads_begin, pads_end) -> bool:
    return all(i + b + e >= d * (k - 1) + 1
               for i, k, d, b, e in zip(src, kernel, dilations, pads_begin, pads_end))
