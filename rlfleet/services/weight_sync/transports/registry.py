"""The one table of weight transports, looked up by the trainer's publisher and the rollout's receiver setup. Its
order is the order `transport: auto` probes its candidates in (auto.py)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rlfleet.services.weight_sync.transports.broadcast import TRANSPORT as BROADCAST
from rlfleet.services.weight_sync.transports.bucketed import TRANSPORT as BUCKETED
from rlfleet.services.weight_sync.transports.contract import Transport
from rlfleet.services.weight_sync.transports.disk_delta import TRANSPORT as DISK_DELTA
from rlfleet.services.weight_sync.transports.nixl import TRANSPORT as NIXL

TRANSPORTS: Mapping[str, Transport] = MappingProxyType({t.name: t for t in (BUCKETED, BROADCAST, DISK_DELTA, NIXL)})


def transport(name: str) -> Transport:
    """The transport called `name`; ValueError naming the known ones otherwise."""
    found = TRANSPORTS.get(name)
    if found is None:
        raise ValueError(f"unknown weight transport '{name}' (available: {', '.join(TRANSPORTS)})")
    return found
