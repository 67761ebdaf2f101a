"""Send side of disk-delta: the first publish writes a base, each later one only what changed since the previous.

Rank 0 keeps the previously published tensors (host memory) to diff against. Every `rebase_every` versions (or
when the tensor set changes) a new base is written, so a replica that fell far behind reads a base and a few deltas.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from rlfleet.services.weight_sync.transports.disk_delta.codec import ENCODINGS, changed_elements, encode
from rlfleet.services.weight_sync.transports.disk_delta.files import version_dir, write_version
from rlfleet.services.weight_sync.transports.manifest import manifest_digest, tensor_xxh64
from rlfleet.v1 import weights_pb2
from rlfleet.weights.dtypes import dtype_name

log = logging.getLogger(__name__)

TRANSPORT = "disk_delta"


class DeltaSender:
    def __init__(self, root: str | Path, encoding: str = "xor", rebase_every: int = 50) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown delta encoding '{encoding}' (known: {', '.join(ENCODINGS)})")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.encoding = encoding
        self.rebase_every = rebase_every
        self._prev: dict[str, torch.Tensor] = {}
        self._prev_version = -1
        self._base_version = -1

    @property
    def endpoint(self) -> str:
        return str(self.root)

    def stage(self, version: int, step: int,
              named_tensors: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        final: dict[str, dict] = {}
        names, parts, changed, total = [], {}, 0, 0
        delta = (self._prev_version >= 0 and version > self._prev_version
                 and version - self._base_version < self.rebase_every)
        current: dict[str, torch.Tensor] = {}
        for name, t in named_tensors:                       # one tensor at a time: a ShardedState gathers lazily
            t = t.detach().to("cpu").contiguous().clone()
            names.append(name)
            current[name] = t
            final[name] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "xxh64": tensor_xxh64(t)}
            total += t.numel()
            prev = self._prev.get(name)
            if delta and (prev is None or prev.shape != t.shape or prev.dtype != t.dtype):
                delta = False
            if delta:
                enc = encode(prev, t, self.encoding)
                changed += changed_elements(enc, self.encoding)
                parts.update({f"{name}::{k}": v for k, v in enc.items()})
        if delta and set(names) != set(self._prev):
            delta = False
        if not delta:
            parts, changed = dict(current), total
            self._base_version = version
        fields = {"version": version, "base_version": self._base_version,
                  "prev_version": self._prev_version if delta else version, "kind": "delta" if delta else "base",
                  "encoding": self.encoding if delta else "", "tensors": final}
        index = write_version(self.root, fields, parts)
        self._prev, self._prev_version = current, version
        log.info("disk-delta version %d: %s, %d of %d elements changed, %d bytes on disk", version, index.kind,
                 changed, total, index.file_bytes)
        entries = [weights_pb2.TensorEntry(name=n, dtype=f["dtype"], shape=f["shape"], xxh64=f["xxh64"],
                                           nbytes=current[n].numel() * current[n].element_size())
                   for n, f in final.items()]
        return weights_pb2.WeightManifest(
            version=version, step=step, transport=TRANSPORT, endpoint=str(version_dir(self.root, version)),
            tensors=entries, total_bytes=sum(e.nbytes for e in entries),
            digest=manifest_digest((e.name, e.xxh64) for e in entries),
            options={"root": str(self.root), "kind": index.kind, "base_version": str(index.base_version),
                     "prev_version": str(index.prev_version), "encoding": index.encoding,
                     "file_bytes": str(index.file_bytes)})

    def close(self) -> None:
        self._prev = {}
