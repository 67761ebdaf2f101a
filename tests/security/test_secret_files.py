"""Key files: ours must be 0600; one mounted for the pod (a Kubernetes Secret or a csi-driver certificate, written
by the kubelet as root with the pod's fsGroup, mode 0440) may be group-readable, never world-readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.security.secret_files import read_secret, write_secret


def test_our_own_key_files_are_the_owners_only(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    write_secret(key, b"secret")
    assert read_secret(key) == b"secret"
    for mode in (0o640, 0o604, 0o644):
        key.chmod(mode)
        with pytest.raises(PermissionError, match="0600"):
            read_secret(key)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user owns needs root")
def test_a_mounted_key_may_be_read_by_the_pods_group_but_never_by_others(tmp_path: Path) -> None:
    key = tmp_path / "tls.key"
    key.write_bytes(b"mounted")
    os.chown(key, 10001, 10001)                       # owned by another user, as the kubelet leaves it
    key.chmod(0o440)
    assert read_secret(key) == b"mounted"
    for mode in (0o444, 0o460, 0o640 | 0o004):
        key.chmod(mode)
        with pytest.raises(PermissionError):
            read_secret(key)
