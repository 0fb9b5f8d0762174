"""95% intervals of agreement figures: percentile bootstrap over prompts (seeded).

Each row of an arm is one prompt, so resampling an arm's values with replacement resamples
prompts. The interval is widened, if ever needed, to contain the point estimate.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 2000
SEED = 0


def interval(values: list[float], level: float = 0.95, resamples: int = RESAMPLES,
             seed: int = SEED) -> tuple[float, float] | None:
    """(low, high) of the mean of `values`; None when there are none."""
    x = np.asarray(values, dtype=np.float64)
    if not x.size:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)  # [resamples]
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    mean = float(x.mean())
    return min(float(low), mean), max(float(high), mean)
