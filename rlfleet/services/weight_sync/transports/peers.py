"""Client side of the control plane's data-plane peer directory (WeightSync.Register / WeightSync.Peers)."""

from __future__ import annotations

import grpc

from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc

CALL_DEADLINE = 30.0


class PeerDirectory:
    """Register this process's data-plane endpoint and look up others', over an existing channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = weight_sync_pb2_grpc.WeightSyncStub(channel)

    def register(self, peer: weight_sync_pb2.PeerInfo) -> None:
        self._stub.Register(peer, timeout=CALL_DEADLINE)

    def peers(self, transport: str, min_peers: int = 0, wait_seconds: float = 0.0) -> list[weight_sync_pb2.PeerInfo]:
        req = weight_sync_pb2.PeersRequest(transport=transport, min_peers=min_peers, wait_seconds=wait_seconds)
        return list(self._stub.Peers(req, timeout=wait_seconds + CALL_DEADLINE).peers)
