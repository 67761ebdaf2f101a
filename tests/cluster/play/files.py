"""ConfigMap and Secret volumes written as the kubelet projects them: one folder per pod volume, each item at its
path with its mode, owned by root and the pod's fsGroup with group read added (as the kubelet does: a non-root
pod reads a 0400 key through its group)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.cluster.play.plan import FileSource


def write_volume(folder: Path, source: FileSource, fs_group: int | None) -> None:
    """Replace `folder` with the files of `source` (a mounted volume's content is read-only inside the pod)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    for rel, (data, mode) in sorted(source.files.items()):
        path = folder / rel
        if path.resolve().parent != folder.resolve() and folder.resolve() not in path.resolve().parents:
            raise ValueError(f"{source.kind} {source.name}: item path {rel!r} leaves the volume")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if fs_group is not None:            # the kubelet's fsGroup: group-owned, group-readable (0400 -> 0440)
            os.chown(path, 0, fs_group)
            mode |= 0o440
        os.chmod(path, mode)
