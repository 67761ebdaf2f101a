"""How a loss metric combines over microbatches, minibatches and ranks, read from its name: most are shares of a
global mean (summed over ranks, averaged over minibatches); a name ending in "_min" or "_max" is an extreme
(tis_weight_min, clip_fraction_high_max): the smallest / largest over every rank and minibatch. A rank with nothing
to measure reports +inf for a min and -inf for a max; `finite_extremes` reports 0 where no rank had a value."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

Reduce = Callable[[Sequence[float]], list[float]]


def extreme(name: str) -> str | None:
    """"min", "max" or None (a sum / mean metric)."""
    return "min" if name.endswith("_min") else "max" if name.endswith("_max") else None


def empty_value(name: str) -> float:
    """What a rank that computed no value of `name` contributes: 0, or the extreme's identity."""
    kind = extreme(name)
    return math.inf if kind == "min" else -math.inf if kind == "max" else 0.0


def combine(name: str, a: float, b: float) -> float:
    """Two partial values of one metric (two microbatches of one rank): summed, or the extreme."""
    kind = extreme(name)
    return min(a, b) if kind == "min" else max(a, b) if kind == "max" else a + b


def reduce_over_ranks(values: Mapping[str, float], sum_ranks: Reduce, max_ranks: Reduce) -> dict[str, float]:
    """Every rank's `values` (the same names on every rank) -> the global ones: sums, mins, maxes."""
    names = sorted(values)
    sums = [n for n in names if extreme(n) is None]
    extremes = [n for n in names if extreme(n) is not None]
    out = dict(zip(sums, sum_ranks([values[n] for n in sums]), strict=True)) if sums else {}
    if extremes:     # min x = -max(-x): one max-reduce for both kinds
        signed = [-values[n] if extreme(n) == "min" else values[n] for n in extremes]
        for n, v in zip(extremes, max_ranks(signed), strict=True):
            out[n] = -v if extreme(n) == "min" else v
    return out


def finite_extremes(totals: dict[str, float]) -> None:
    """Replace the extremes that no rank measured (still +-inf) by 0, in place."""
    for name, value in totals.items():
        if extreme(name) is not None and not math.isfinite(value):
            totals[name] = 0.0
