"""Tensor checksums and manifest digests: what every transport and every replica agree on.

torch is imported only by the functions that hash tensors: the weight_sync service checks manifest digests
(names and hashes, no tensors) and starts ~2 s sooner without it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import xxhash

from rlfleet.v1 import weights_pb2

if TYPE_CHECKING:
    import torch


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (contiguous, on CPU), without a copy when it already is."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)   # 0-dim tensors too: [numel]
    return memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else memoryview(b"")


def tensor_xxh64(t: torch.Tensor) -> str:
    return xxhash.xxh64(tensor_bytes(t)).hexdigest()


def buffer_xxh64(buf: bytes | memoryview) -> str:
    """xxh64 of raw bytes already laid out in memory (a bucket slice): equals tensor_xxh64 of the same tensor."""
    return xxhash.xxh64(buf).hexdigest()


def check_manifest_digest(manifest: weights_pb2.WeightManifest) -> str | None:
    """None when the manifest's digest matches its tensor entries, else why not."""
    want = manifest_digest(manifest_pairs(manifest))
    if manifest.digest != want:
        return f"manifest digest {manifest.digest or '(empty)'} does not match its tensor entries ({want})"
    return None


def manifest_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """xxh64 over name and tensor hash of every tensor, in order."""
    h = xxhash.xxh64()
    for name, tensor_hash in pairs:
        h.update(name.encode())
        h.update(b"\0")
        h.update(tensor_hash.encode())
        h.update(b"\n")
    return h.hexdigest()


def digest_of(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    return manifest_digest((name, tensor_xxh64(t)) for name, t in named)


def manifest_pairs(manifest: weights_pb2.WeightManifest) -> list[tuple[str, str]]:
    return [(e.name, e.xxh64) for e in manifest.tensors]

