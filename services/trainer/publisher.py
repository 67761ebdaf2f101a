"""Publishing a weight version: stage the full state dict in the bucketed data plane, then WeightSync.Publish."""

from __future__ import annotations

import logging

import torch

from rlfleet.config import Config
from rlfleet.v1 import weights_pb2
from services.trainer.clients import WeightSyncClient

log = logging.getLogger(__name__)


class WeightPublisher:
    """Rank 0 only. Holds the data-plane sender (it serves WeightStream.Fetch on endpoints.trainer_data)."""

    def __init__(self, cfg: Config, token: str | None, weight_sync: WeightSyncClient) -> None:
        from services.weight_sync.transports.bucketed import BucketedSender

        self.endpoint = cfg.endpoints.trainer_data
        if not self.endpoint:
            raise ValueError("endpoints.trainer_data is empty: the trainer has nowhere to serve weights from")
        self.sender = BucketedSender(bind=self.endpoint, token=token,
                                     bucket_bytes=int(cfg.weight_sync.bucket_mb * 2**20),
                                     chunk_bytes=cfg.weight_sync.chunk_kb * 1024)
        self.weight_sync = weight_sync

    def publish(self, version: int, step: int, state: dict[str, torch.Tensor]) -> weights_pb2.WeightManifest:
        """Stage `state` (name -> full tensor, in model order) as `version` and announce it."""
        manifest = self.sender.stage(version, step, list(state.items()))
        if not manifest.endpoint:
            manifest.endpoint = self.endpoint
        subscribers = self.weight_sync.publish(manifest)
        log.info("published version %d (step %d, %d tensors, %d bytes, digest %s) to %d subscribers",
                 version, step, len(manifest.tensors), manifest.total_bytes, manifest.digest, subscribers)
        return manifest

    def close(self) -> None:
        for name in ("close", "stop"):
            fn = getattr(self.sender, name, None)
            if callable(fn):
                fn()
                return
