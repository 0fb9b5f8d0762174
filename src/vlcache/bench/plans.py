"""A stand-in recompute plan for models without a profile (random weights).

A profiled plan (`vlcache profile`) spends more of its budget in early layers; for timing only
the per-layer token counts matter, so a monotone linear ramp with the same mean is a fair
stand-in. It is spelled `ramp:B` in the bench and always reported as such.
"""

from __future__ import annotations

from vlcache.plan import Plan


def ramp_plan(budget: float, num_layers: int) -> Plan:
    """Ratios falling linearly from min(1, 2B) at layer 0 to the value that makes the mean B."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"ramp budget must be in [0, 1], got {budget}")
    if num_layers == 1:
        return Plan((budget,), name=f"ramp:{budget:g}")
    top = min(1.0, 2 * budget)
    bottom = 2 * budget - top  # mean of a linear ramp is (top + bottom) / 2
    step = (top - bottom) / (num_layers - 1)
    ratios = tuple(max(0.0, top - step * i) for i in range(num_layers))
    return Plan(ratios, name=f"ramp:{budget:g}", meta={"stand_in": "linear ramp, not profiled"})
