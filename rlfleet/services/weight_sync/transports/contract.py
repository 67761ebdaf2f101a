"""The contract every weight transport meets, and the narrow interfaces it is given.

A transport is a pair: a `Sender` in trainer rank 0 (and, for NIXL, in every trainer rank) that stages a version and
returns its manifest, and a `Receiver` in each rollout replica that turns a manifest into tensors. Each transport
package (bucketed/, broadcast/, nixl/, disk_delta/) exports one `Transport` found through registry.py; what a
factory needs comes in a frozen `SenderSetup` / `ReceiverSetup`. A receiver sees the replica's weights only through
`WeightHolder` (the version served and the tensors held), never the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import torch

from rlfleet.security.identity import Credential
from rlfleet.services.weight_sync.transports.sharded import ShardedState
from rlfleet.v1 import weights_pb2

Named = Iterable[tuple[str, torch.Tensor]] | ShardedState
# fetch(manifest, token, timeout, replica_id) -> [(name, tensor)] in manifest order; raises WeightTransferError
Fetch = Callable[[weights_pb2.WeightManifest, Credential, float, str], list[tuple[str, torch.Tensor]]]


class Sender(Protocol):
    """Trainer side. stage() moves (or readies) a version's tensors and returns the manifest to publish."""

    def stage(self, version: int, step: int, named: Named) -> weights_pb2.WeightManifest: ...

    def close(self) -> None: ...


class Receiver(Protocol):
    """Replica side. fetch() returns [(name, tensor)] in manifest order, or raises WeightTransferError."""

    def fetch(self, manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
              replica_id: str = "") -> list[tuple[str, torch.Tensor]]: ...

    def close(self) -> None: ...


class WeightHolder(Protocol):
    """What a receiver may read of the replica: the version served and the tensors held (read, never modified)."""

    @property
    def weight_version(self) -> int: ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...


@dataclass(frozen=True)
class SenderSetup:
    """Everything a sender factory may use (from the trainer's config and process)."""

    endpoint: str                    # endpoints.trainer_data: where gRPC-served transports listen
    token: Credential
    bucket_bytes: int
    chunk_bytes: int
    control: grpc.Channel | None     # the WeightSync control plane (peer directory)
    device: torch.device
    rank: int = 0
    world: int = 1
    replicas: int = 1                # rollout.replicas: receivers a sender waits for
    join_seconds: float = 120.0
    timeout: float = 600.0
    group_host: str = ""             # broadcast: the rendezvous host ("" = endpoint's host)
    op_timeout: float = 30.0         # broadcast: seconds one op may take on the trainer before the group is dropped
    delta_root: Path = Path("weights_delta")
    delta_encoding: str = "xor"
    rebase_every: int = 50


@dataclass(frozen=True)
class ReceiverSetup:
    """Everything a receiver factory may use (from the replica's config and process)."""

    replica_id: str
    holder: WeightHolder
    control: grpc.Channel | None     # the WeightSync control plane (peer directory); None: stateless ones only
    capacity_bytes: int = 0          # nixl: bytes of one staging slot
    device: str = "cpu"
    join_seconds: float = 120.0


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class AutoCandidate:
    """What `transport: auto` (auto.py) needs of a transport it may pick. Its estimated seconds per update are
    fixed_seconds + model bytes * bytes_fraction / the probe's rate."""

    fixed_seconds: float             # paid per update whatever the size (rendezvous, notifications, file syncs)
    probe: Callable[[], float]       # GB/s of its data plane's copy path, measured in-process at start-up
    bytes_fraction: float = 1.0      # bytes it moves per update / the model's bytes
    missing: Callable[[], str | None] = _always_available   # why it cannot be a candidate here; None: it can


@dataclass(frozen=True)
class Transport:
    """One transport: its name (weight_sync.transport, WeightManifest.transport) and how to build each half."""

    name: str
    make_sender: Callable[[SenderSetup], Sender]
    make_receiver: Callable[[ReceiverSetup], Receiver]
    needs_endpoint: bool = False     # serves gRPC on endpoints.trainer_data
    needs_control: bool = False      # the receiver registers with / looks up the control plane
    fetch: Fetch | None = None       # a stateless transport's fetch: any process can call it without setup
    auto: AutoCandidate | None = None    # how `transport: auto` weighs it; None: auto never picks it
    always_received: bool = False    # every replica sets up its receiver, whatever the transport configured
    needs_capacity: bool = False     # its receiver registers staging memory of ReceiverSetup.capacity_bytes
