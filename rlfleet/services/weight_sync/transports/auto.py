"""`transport: auto`: measure each available transport's bandwidth at start-up and pick one for the model's size.

Every transport pays a fixed cost per update (rendezvous round trips, notifications, file syncs) and then moves
bytes at its own rate, so the estimate is `fixed + bytes / bandwidth` and the smallest wins. NIXL's fixed cost is
the highest (per-bucket descriptors, notifications; Miles's own table has P2P slower than broadcast for small
models), broadcast needs a collective group, disk-delta moves a fraction of the bytes but pays for the diff, zstd
and two file passes. The probes are in-process loopback measurements of each data plane's copy path.

What auto weighs is declared on each transport's registry record (contract.AutoCandidate: its fixed cost, its probe,
the fraction of the bytes it moves, whether it can be a candidate in this process); candidates are taken in the
registry's order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rlfleet.services.weight_sync.transports.contract import AutoCandidate
from rlfleet.services.weight_sync.transports.registry import TRANSPORTS

log = logging.getLogger(__name__)

AUTO = "auto"                    # the weight_sync.transport value that leaves the choice to this module
DEFAULT_FIXED_SECONDS = 0.1      # a name without an AutoCandidate record


@dataclass(frozen=True)
class Choice:
    transport: str
    reason: str
    estimates: dict[str, float]      # transport -> seconds per update
    bandwidth: dict[str, float]      # transport -> measured GB/s


@dataclass(frozen=True)
class Candidates:
    """What auto may pick in this process: each candidate's record, in registry order, and why the others with a
    record may not (a library that does not import here)."""

    here: dict[str, AutoCandidate]
    missing: dict[str, str]

    def probes(self) -> dict[str, Callable[[], float]]:
        return {name: c.probe for name, c in self.here.items()}


def candidates_here() -> Candidates:
    """Every transport that declares an AutoCandidate, split by whether it can be a candidate in this process."""
    here: dict[str, AutoCandidate] = {}
    missing: dict[str, str] = {}
    for plug in TRANSPORTS.values():
        if plug.auto is None:
            continue
        why = plug.auto.missing()
        if why is None:
            here[plug.name] = plug.auto
        else:
            missing[plug.name] = why
    return Candidates(here, missing)


def choose(model_bytes: int, available: Mapping[str, Callable[[], float]]) -> Choice:
    """Measure every available transport (name -> probe returning GB/s) and pick the fastest for model_bytes."""
    bw, est = {}, {}
    for name, probe in available.items():
        try:
            bw[name] = probe()
        except Exception as exc:  # noqa: BLE001 - a transport whose probe fails is not a candidate
            log.warning("transport %s probe failed (%s): not a candidate", name, exc)
            continue
        candidate = TRANSPORTS[name].auto if name in TRANSPORTS else None
        fixed = candidate.fixed_seconds if candidate is not None else DEFAULT_FIXED_SECONDS
        moved = model_bytes * (candidate.bytes_fraction if candidate is not None else 1.0)
        est[name] = fixed + moved / max(bw[name] * 1e9, 1.0)
    if not est:
        raise RuntimeError("no weight transport could be probed")
    best = min(est, key=est.__getitem__)
    ranked = ", ".join(f"{n} {est[n] * 1e3:.1f} ms ({bw[n]:.2f} GB/s)" for n in sorted(est, key=est.__getitem__))
    reason = (f"model {model_bytes / 2**20:.1f} MiB: estimated per-update time {ranked}; "
              f"{best} is fastest at this size")
    return Choice(best, reason, est, bw)
