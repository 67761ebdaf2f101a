"""Publishing a weight version: stage it in the configured data plane, then WeightSync.Publish.

Rank 0 holds a WeightPublisher. With a sharded model every trainer rank calls `publish_sharded` (rank 0 through
its publisher, the others through `follow_publish`) so each parameter is all-gathered only when a bucket needs it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist

from rlfleet.config import Config
from rlfleet.rpc import channel
from rlfleet.v1 import weights_pb2
from services.trainer.clients import WeightSyncClient
from services.weight_sync.transports.sharded import ShardedState

log = logging.getLogger(__name__)


def _delta_root(cfg: Config) -> Path:
    return Path(cfg.weight_sync.delta_dir) if cfg.weight_sync.delta_dir else Path(cfg.run_dir) / "weights_delta"


def resolve_transport(cfg: Config, model_bytes: int) -> str:
    """cfg.weight_sync.transport, or for `auto` the one the start-up probes pick (logged with the reason)."""
    name = cfg.weight_sync.transport
    if name != "auto":
        return name
    from services.weight_sync.transports.auto import choose, probe_delta, probe_memcpy, probe_nixl
    from services.weight_sync.transports.nixl_agent import available

    probes = {"broadcast": probe_memcpy, "disk_delta": probe_delta}
    missing = available()
    if missing is None:
        probes["nixl"] = probe_nixl
    else:
        log.info("transport auto: nixl is not a candidate (%s)", missing)
    choice = choose(model_bytes, probes)
    log.info("transport auto chose %s: %s", choice.transport, choice.reason)
    return choice.transport


class WeightPublisher:
    """Rank 0 only. Holds the data-plane sender (bucketed and broadcast serve gRPC on endpoints.trainer_data)."""

    def __init__(self, cfg: Config, token: str | None, weight_sync: WeightSyncClient, model_bytes: int = 0,
                 device: torch.device | str = "cpu", world: int = 1) -> None:
        ws = cfg.weight_sync
        self.weight_sync = weight_sync
        self._control = channel(cfg.endpoints.weight_sync, token) if cfg.endpoints.weight_sync else None
        self.transport = resolve_transport(cfg, model_bytes)
        self.endpoint = cfg.endpoints.trainer_data
        bucket_bytes = int(ws.bucket_mb * 2**20)
        if self.transport in ("bucketed", "broadcast") and not self.endpoint:
            raise ValueError("endpoints.trainer_data is empty: the trainer has nowhere to serve weights from")
        if self.transport == "disk_delta":
            from services.weight_sync.transports.delta_sender import DeltaSender

            self.sender = DeltaSender(_delta_root(cfg), ws.delta_encoding, ws.rebase_every)
            return
        if self.transport == "nixl":
            from services.weight_sync.peers import PeerDirectory
            from services.weight_sync.transports.nixl_sender import NixlSender

            directory = PeerDirectory(self._control)
            self.sender = NixlSender(directory.peers, bucket_bytes, 0, world, device,
                                     expected_replicas=cfg.rollout.replicas, wait_seconds=ws.join_seconds,
                                     timeout=ws.update_timeout)
            return
        from services.weight_sync.transports.bucketed import BucketedSender

        stream = BucketedSender(bind=self.endpoint, token=token, bucket_bytes=bucket_bytes,
                                chunk_bytes=ws.chunk_kb * 1024)
        if self.transport == "bucketed":
            self.sender = stream
            return
        from services.weight_sync.peers import PeerDirectory
        from services.weight_sync.transports.broadcast_sender import BroadcastSender

        host = ws.group_host or self.endpoint.rpartition(":")[0] or "127.0.0.1"
        self.sender = BroadcastSender(stream, PeerDirectory(self._control).register, cfg.rollout.replicas,
                                      rendezvous_host=host, device=device, join_seconds=ws.join_seconds,
                                      timeout=ws.update_timeout)

    def publish(self, version: int, step: int, state: dict[str, torch.Tensor] | ShardedState,
                adapter: dict[str, str] | None = None) -> weights_pb2.WeightManifest:
        """Stage `state` (name -> full tensor in model order, or a ShardedState) as `version` and announce it.

        With a ShardedState every other trainer rank must run `follow_publish` at the same time.
        """
        items = state if isinstance(state, ShardedState) else list(state.items())
        manifest = self.sender.stage(version, step, items)
        if isinstance(state, ShardedState) and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()                   # every rank's NIXL writes are done before the version is announced
        if not manifest.endpoint:
            manifest.endpoint = self.endpoint
        if adapter:                          # LoRA: `state` holds adapter tensors only (rank, alpha, targets)
            manifest.adapter_only = True
            manifest.options.update(adapter)
        subscribers = self.weight_sync.publish(manifest)
        log.info("published version %d over %s (step %d, %d tensors, %d bytes, digest %s) to %d subscribers",
                 version, manifest.transport, step, len(manifest.tensors), manifest.total_bytes, manifest.digest,
                 subscribers)
        return manifest

    def publish_sharded(self, version: int, step: int, model: torch.nn.Module,
                        dtype: torch.dtype | None = None) -> weights_pb2.WeightManifest:
        return self.publish(version, step, ShardedState(model, dtype))

    def close(self) -> None:
        self.sender.close()
        if self._control is not None:
            self._control.close()


def follow_publish(model: torch.nn.Module, dtype: torch.dtype | None = None, nixl_sender: object | None = None,
                   version: int = 0, step: int = 0) -> None:
    """Ranks other than 0: take part in rank 0's publish of a ShardedState (gathers; NIXL writes of own replicas)."""
    state = ShardedState(model, dtype)
    if nixl_sender is not None:
        nixl_sender.stage(version, step, state)
    else:
        state.drain()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
