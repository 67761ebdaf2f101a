"""Receive side of disk-delta: rebuild a version from what the replica holds plus the deltas on disk.

The chain is followed back from the wanted version through `prev_version` until it reaches the version the
replica holds (its tensors as the start) or a base (read whole). Every file is checked before it is decompressed
and every rebuilt tensor against the index's final checksum and the manifest, before anything is returned. This
runs while the engine keeps generating; the engine pauses only to copy the result in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlfleet.security.identity import Credential
from rlfleet.services.weight_sync.transports.disk_delta.codec import apply
from rlfleet.services.weight_sync.transports.disk_delta.files import Index, read_index, read_parts
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from rlfleet.services.weight_sync.transports.manifest import check_manifest_digest, tensor_xxh64
from rlfleet.v1 import weights_pb2

TRANSPORT = "disk_delta"
MAX_CHAIN = 10_000

# () -> (version held, {name: tensor held}); tensors are read, never modified
Holdings = Callable[[], tuple[int, dict[str, torch.Tensor]]]


def _chain(root: Path, version: int, held: int) -> list[Index]:
    """Indexes to apply, oldest first: from a base (or the version after `held`) up to `version`."""
    out: list[Index] = []
    v = version
    for _ in range(MAX_CHAIN):
        idx = read_index(root, v)
        out.append(idx)
        if idx.kind == "base" or idx.prev_version == held:
            return out[::-1]
        v = idx.prev_version
    raise ValueError(f"delta chain from version {version} longer than {MAX_CHAIN}")


def rebuild(root: Path, version: int, held_version: int, held: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    chain = _chain(root, version, held_version)
    if chain[0].kind != "base" and not set(chain[0].tensors) <= set(held):
        chain = _chain(root, version, -1)          # held lacks these tensors (LoRA adapters): from the base
    state: dict[str, torch.Tensor] = {} if chain[0].kind == "base" else dict(held)
    for idx in chain:
        parts = read_parts(root, idx)
        if idx.kind == "base":
            state = {n: parts[n] for n in idx.tensors}
            continue
        state = {n: apply(state[n], {k.split("::", 1)[1]: v for k, v in parts.items() if k.split("::", 1)[0] == n},
                          idx.encoding) for n in idx.tensors}
    final = chain[-1].tensors
    bad = [n for n, f in final.items() if tensor_xxh64(state[n]) != f["xxh64"]]
    if bad:
        raise ValueError(f"rebuilt tensors do not match the index checksums: {', '.join(bad[:4])}")
    return state


class DeltaReceiver:
    def __init__(self, holdings: Holdings) -> None:
        self._holdings = holdings
        self._last: tuple[int, dict[str, torch.Tensor]] | None = None

    def fetch(self, manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
              replica_id: str = "") -> list[tuple[str, torch.Tensor]]:
        version = manifest.version
        if manifest.transport != TRANSPORT:
            raise WeightTransferError(version, f"manifest transport is '{manifest.transport}', not '{TRANSPORT}'")
        problem = check_manifest_digest(manifest)
        if problem:
            raise WeightTransferError(version, problem)
        held_version, held = self._holdings()
        engine_names = set(held)
        if self._last is not None and self._last[0] == held_version:
            held = {**held, **self._last[1]}       # what this receiver rebuilt last (adapter tensors the engine merged)
        try:
            state = rebuild(Path(manifest.options["root"]), version, held_version, held)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise WeightTransferError(version, f"disk-delta: {type(exc).__name__}: {exc}") from None
        out = []
        for e in manifest.tensors:
            t = state.get(e.name)
            if t is None or tensor_xxh64(t) != e.xxh64:
                raise WeightTransferError(version, f"disk-delta: tensor {e.name} does not match the manifest")
            out.append((e.name, t))
        self._last = (version, {n: t for n, t in out if n not in engine_names})   # only what the engine lacks
        return out

    def close(self) -> None:
        self._last = None
