"""Secret files (private keys, tokens): mode 0600 from the first byte, written atomically.

The temporary file is created with O_CREAT|O_EXCL and mode 0600 (never chmodded after the fact, so no reader can
open it in between), fsynced, then renamed over the destination.
"""

from __future__ import annotations

import os
from pathlib import Path

SECRET_MODE = 0o600


def write_secret(path: Path, data: bytes) -> None:
    """Write `data` to `path` as a 0600 file: exclusive create of a temp file with the mode, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_secret(path: Path) -> bytes:
    """The bytes of a secret file; PermissionError when others may read it (a key left world-readable).

    A file this user owns must be its owner's only (0600). A file another user owns (a Kubernetes Secret or a
    csi-driver certificate, which the kubelet writes as root with the pod's fsGroup: mode 0440) may also be read by
    its group, never written by it."""
    path = Path(path)
    st = path.stat()
    mode = st.st_mode & 0o777
    allowed = 0o700 if st.st_uid == os.geteuid() else 0o740
    if mode & ~allowed:
        raise PermissionError(f"{path}: secret file has mode {mode:o}; it must be readable by its owner only (0600), "
                              "or by its owner and group when mounted for this pod (0440)")
    return path.read_bytes()
