"""The Wilson 95% interval of a held-out pass rate, against values worked out by hand from the interval's
definition: the p whose normal test at level z does not reject the observed proportion, i.e. the roots of
(phat - p)^2 = z^2 p (1 - p) / n."""

from __future__ import annotations

import math

import pytest

from rlfleet.local.intervals import Z95, wilson


def roots(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The quadratic (1 + z^2/n) p^2 - (2 phat + z^2/n) p + phat^2 = 0, solved directly."""
    phat = k / n
    a, b, c = 1 + z * z / n, -(2 * phat + z * z / n), phat * phat
    disc = math.sqrt(b * b - 4 * a * c)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


@pytest.mark.parametrize(("k", "n"), [(56, 100), (79, 100), (1, 10), (99, 100), (21, 64), (18, 64)])
def test_wilson_bounds_are_the_roots_of_its_defining_quadratic(k: int, n: int) -> None:
    lo, hi = roots(k, n)
    got = wilson(k, n)
    assert got.low == pytest.approx(lo, abs=1e-12) and got.high == pytest.approx(hi, abs=1e-12)
    assert got.contains(k / n)


def test_wilson_worked_by_hand() -> None:
    # 0 of 10: the lower bound is 0 and the upper z^2 / (n + z^2) = 3.8415 / 13.8415
    assert wilson(0, 10).low == 0.0
    assert wilson(0, 10).high == pytest.approx(3.841459 / 13.841459, abs=1e-6)
    # 56 of 100 (the TRL comparison's starting accuracy): centre (0.56 + 0.019207) / 1.038415 = 0.557780,
    # half-width 1.959964 * sqrt(0.002464 + 0.00009604) / 1.038415 = 0.095499
    got = wilson(56, 100)
    assert got.low == pytest.approx(0.462281, abs=1e-5) and got.high == pytest.approx(0.653280, abs=1e-5)
    # 0.56 -> 0.79 over 100 prompts lies outside the before's interval; 0.56 -> 0.60 does not
    assert not got.contains(0.79) and got.contains(0.60)
    assert wilson(3, 0).low == 0.0 and wilson(3, 0).high == 1.0
