"""Clicks from a hidden teacher's logit, shared by the generated datasets (synthetic, clicklog).

``sigmoid`` is the click probability of a logit; ``fit_bias`` is the bias that makes the mean
click probability hit the configured click-through rate.
"""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for large |x|


def fit_bias(z: np.ndarray, target: float) -> float:
    """The b with mean(sigmoid(b + z)) == target, by bisection."""
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if sigmoid(mid + z).mean() < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)
