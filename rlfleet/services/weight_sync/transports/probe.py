"""Measuring a data plane's copy path at start-up for `transport: auto`: the rate of one in-process loopback copy,
in GB/s. Each transport's probe (AutoCandidate.probe) is built on these."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PROBE_BYTES = 32 << 20


def gbps(fn: Callable[[], None], nbytes: int) -> float:
    """GB/s of fn moving nbytes: one warm-up call, then one timed call."""
    fn()                                               # warm up
    t0 = time.perf_counter()
    fn()
    return nbytes / max(time.perf_counter() - t0, 1e-9) / 1e9


def probe_memcpy(nbytes: int = PROBE_BYTES) -> float:
    """A plain memory copy: what a collective broadcast of buckets moves at, in-process."""
    a, b = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    return gbps(lambda: b.copy_(a), nbytes)
