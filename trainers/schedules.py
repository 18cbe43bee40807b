"""Gate schedules: how pruning pressure rises over the pruning phase (methods.md section 5)."""

from __future__ import annotations

import math

SHAPES = ("linear", "cubic", "cosine", "one_shot")


def ramp(progress: float, *, start: float = 0.0, warmup: float = 0.5, shape: str = "linear") -> float:
    """Fraction of the final pressure (0..1) at ``progress`` (0..1) through the pruning phase.

    Nothing before ``start``; the rise takes ``warmup`` of the phase. ``cubic`` is Zhu & Gupta's
    1 - (1 - k/n)^3: fast at first, gentle near the end.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown schedule shape {shape!r}; choose one of {SHAPES}")
    if progress < start:
        return 0.0
    if shape == "one_shot" or warmup <= 0.0:
        return 1.0
    k = min(1.0, (progress - start) / warmup)
    if shape == "linear":
        return k
    if shape == "cubic":
        return 1.0 - (1.0 - k) ** 3
    return 0.5 * (1.0 - math.cos(math.pi * k))  # cosine
