"""Confidence intervals for a held-out pass rate: how far a measured accuracy over n prompts may be from the model's
true one, so a summary can say whether before -> after is more than the noise of n prompts."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054          # the standard normal's 97.5% quantile: a two-sided 95% interval


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        return f"[{self.low:.3f}, {self.high:.3f}]"


def wilson(successes: float, n: int, z: float = Z95) -> Interval:
    """The Wilson score interval of a proportion successes/n (95% by default): better than the normal approximation
    at small n and near 0 or 1, and never outside [0, 1]. n = 0: the whole [0, 1]."""
    if n <= 0:
        return Interval(0.0, 1.0)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Interval(max(0.0, centre - half), min(1.0, centre + half))
