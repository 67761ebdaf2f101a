"""The Wilson 95% interval computed by hand for the e2e tests: the roots of the interval's quadratic, written out
independently of rlfleet/local/intervals.py (the code under test)."""

from __future__ import annotations

import math

Z = 1.959963984540054           # the normal quantile of 0.975


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """The roots of (1 + z^2/n) p^2 - (2 k/n + z^2/n) p + (k/n)^2 = 0."""
    phat = k / n
    a, b, c = 1 + Z * Z / n, -(2 * phat + Z * Z / n), phat * phat
    d = math.sqrt(b * b - 4 * a * c)
    return (-b - d) / (2 * a), (-b + d) / (2 * a)
