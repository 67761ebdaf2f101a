"""Publishing a weight version: stage it in the configured data plane, then WeightSync.Publish.

Rank 0 holds a WeightPublisher. With a sharded model every trainer rank takes part (rank 0 through `publish` with
a ShardedState, the others through `follow_publish` on the same state) so each parameter is all-gathered only when
the sender reaches it. After each pass over the state all ranks agree (all_reduce MAX of a flag rank 0 sets) on
whether to go again: a broadcast sender that lost its group (GroupLost) has consumed every tensor but staged
nothing, so rank 0 stages once more -- now over the gRPC fallback -- and every rank gathers once more with it.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path

import torch

from rlfleet.config import Config, ConfigError
from rlfleet.runtime.rpc import channel
from rlfleet.security.identity import Credential
from rlfleet.security.modes import security_mode
from rlfleet.security.signing import HashingTee, Signer, sign_manifest
from rlfleet.services.trainer.clients import WeightSyncClient
from rlfleet.services.trainer.collectives import all_reduce_max
from rlfleet.services.weight_sync.transports.auto import AUTO, candidates_here, choose
from rlfleet.services.weight_sync.transports.contract import Sender, SenderSetup
from rlfleet.services.weight_sync.transports.errors import GroupLost
from rlfleet.services.weight_sync.transports.registry import transport
from rlfleet.services.weight_sync.transports.sharded import ShardedState
from rlfleet.v1 import weights_pb2

log = logging.getLogger(__name__)

# What rank 0 tells every trainer rank after a pass over a ShardedState (the largest value over ranks wins).
DONE, REDO, FAILED = 0, 1, 2
PASSES = 2                    # the first stage, and one more after a lost broadcast group


def _delta_root(cfg: Config) -> Path:
    return Path(cfg.weight_sync.delta_dir) if cfg.weight_sync.delta_dir else Path(cfg.run_dir) / "weights_delta"


def resolve_transport(cfg: Config, model_bytes: int) -> str:
    """cfg.weight_sync.transport, or for `auto` the one the start-up probes pick (logged with the reason)."""
    name = cfg.weight_sync.transport
    if name != AUTO:
        return name
    candidates = candidates_here()
    for missing, why in candidates.missing.items():
        log.info("transport auto: %s is not a candidate (%s)", missing, why)
    choice = choose(model_bytes, candidates.probes())
    log.info("transport auto chose %s: %s", choice.transport, choice.reason)
    return choice.transport


def plaintext_data_token(cfg: Config) -> str:
    """weight_sync.data_plane_tls false under mtls: the random token the plaintext data plane asks every Fetch for
    ("" when the data plane is mTLS). Only with signed weights: the signature and BLAKE3 digests are then what keep
    the bytes honest."""
    if cfg.weight_sync.data_plane_tls or not security_mode(cfg.security.mode).uses_pki:
        return ""
    if not (cfg.security.signing_key and cfg.security.signing_public_key):
        raise ConfigError("weight_sync.data_plane_tls false needs signed weights (security.signing_key and "
                          "signing_public_key): a plaintext data plane keeps integrity only through the signatures")
    log.warning("weight_sync.data_plane_tls is false: weights cross the network unencrypted (signed, so replicas "
                "detect any change; anyone who sees the traffic can read or fetch them)")
    return secrets.token_urlsafe(32)


class WeightPublisher:
    """Rank 0 only. Holds the data-plane sender (bucketed and broadcast serve gRPC on endpoints.trainer_data)."""

    def __init__(self, cfg: Config, token: Credential, weight_sync: WeightSyncClient, model_bytes: int = 0,
                 device: torch.device | str = "cpu", world: int = 1) -> None:
        ws = cfg.weight_sync
        self.weight_sync = weight_sync
        # this trainer's lineage: its start time in ms, so a trainer resumed from an older checkpoint publishes
        # under a newer epoch than anything the run published before, and replicas order by (epoch, version)
        self.epoch = time.time_ns() // 1_000_000
        self.device = torch.device(device)            # where the flag all_reduce runs (CUDA under NCCL)
        self.signer = Signer.from_file(cfg.security.signing_key) if cfg.security.signing_key else None
        self._control = channel(cfg.endpoints.weight_sync, token) if cfg.endpoints.weight_sync else None
        self.transport = resolve_transport(cfg, model_bytes)
        self.endpoint = cfg.endpoints.trainer_data
        plug = transport(self.transport)
        if plug.needs_endpoint and not self.endpoint:
            raise ValueError("endpoints.trainer_data is empty: the trainer has nowhere to serve weights from")
        self.data_token = plaintext_data_token(cfg) if plug.needs_endpoint else ""
        self.sender: Sender = plug.make_sender(SenderSetup(
            endpoint=self.endpoint, token=self.data_token or token, bucket_bytes=int(ws.bucket_mb * 2**20),
            chunk_bytes=ws.chunk_kb * 1024,
            control=self._control, device=self.device, rank=0, world=world, replicas=cfg.rollout.replicas,
            join_seconds=ws.join_seconds, timeout=ws.update_timeout, group_host=ws.group_host,
            op_timeout=ws.broadcast_op_timeout,
            delta_root=_delta_root(cfg), delta_encoding=ws.delta_encoding, rebase_every=ws.rebase_every))

    def publish(self, version: int, step: int, state: dict[str, torch.Tensor] | ShardedState,
                adapter: dict[str, str] | None = None,
                options: dict[str, str] | None = None) -> weights_pb2.WeightManifest:
        """Stage `state` (name -> full tensor in model order, or a ShardedState) as `version` and announce it.
        `options` go into the manifest as they are (e.g. the tied aliases, rlfleet/weights/tied.py).

        With a ShardedState every other trainer rank must run `follow_publish` at the same time.
        """
        tee = HashingTee(state if isinstance(state, ShardedState) else list(state.items())) if self.signer else None
        manifest = self._stage(version, step, state, tee)
        if not manifest.endpoint:
            manifest.endpoint = self.endpoint
        manifest.data_plane_token = self.data_token
        manifest.epoch = self.epoch
        if options:
            manifest.options.update(options)
        if adapter:                          # LoRA: `state` holds adapter tensors only (rank, alpha, targets)
            manifest.adapter_only = True
            manifest.options.update(adapter)
        if tee is not None and self.signer is not None:     # BLAKE3 per tensor (seen on the way out), Ed25519
            sign_manifest(manifest, tee.digests, self.signer)
        subscribers = self.weight_sync.publish(manifest)
        log.info("published version %d over %s (step %d, %d tensors, %d bytes, digest %s) to %d subscribers",
                 version, manifest.transport, step, len(manifest.tensors), manifest.total_bytes, manifest.digest,
                 subscribers)
        return manifest

    def _stage(self, version: int, step: int, state: dict[str, torch.Tensor] | ShardedState,
               tee: HashingTee | None = None) -> weights_pb2.WeightManifest:
        """sender.stage, once more after GroupLost. With a ShardedState each pass ends in the flag all_reduce that
        `follow_publish` waits in: a barrier (every rank's NIXL writes are done before the version is announced)
        and the word on whether the gathers run again."""
        sharded = isinstance(state, ShardedState)
        items: list[tuple[str, torch.Tensor]] | ShardedState | HashingTee = \
            tee if tee is not None else state if isinstance(state, ShardedState) else list(state.items())
        for attempt in range(PASSES):
            lost: GroupLost | None = None
            try:
                manifest = self.sender.stage(version, step, items)
            except GroupLost as exc:              # every tensor was consumed, nothing staged
                lost = exc
                log.warning("%s: %s", exc, "staging it again" if attempt + 1 < PASSES else "giving up")
            flag = DONE if lost is None else REDO if attempt + 1 < PASSES else FAILED
            if sharded:
                flag = all_reduce_max(flag, self.device)
            if flag == DONE:
                return manifest
            if flag == FAILED:
                assert lost is not None
                raise lost
        raise AssertionError("unreachable: the last pass ends DONE or FAILED")

    def close(self) -> None:
        self.sender.close()
        if self._control is not None:
            self._control.close()


def follow_publish(state: ShardedState, device: torch.device | str = "cpu", nixl_sender: Sender | None = None,
                   version: int = 0, step: int = 0) -> None:
    """Ranks other than 0: take part in rank 0's publish of the same ShardedState (its gathers; NIXL writes of this
    rank's replicas), pass after pass for as long as rank 0 says REDO. Raises GroupLost when rank 0 gave up."""
    device = torch.device(device)
    for _ in range(PASSES):
        if nixl_sender is not None:
            nixl_sender.stage(version, step, state)
        else:
            state.drain()
        flag = all_reduce_max(DONE, device)
        if flag == DONE:
            return
        if flag == FAILED:
            raise GroupLost(version, "rank 0 lost the broadcast group on its last pass as well")
    raise RuntimeError(f"weight version {version}: rank 0 asked for more than {PASSES} passes")
