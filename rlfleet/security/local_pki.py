"""The run CA of a local run: its key lives in the launcher's memory only; each process gets a folder of its own.

`LocalPki(RUN/pki)` makes a fresh CA (a new one at every launch: certificates of an earlier launch stop being
accepted) and writes only its certificate. `issue(role, name)` writes RUN/pki/<name>/ (0700) with <name>.crt,
<name>.key (0600) and ca.crt: the one folder that process is told about (RLFLEET_IDENTITY_DIR). Replicas added by
`rlfleet scale` are issued the same way, from the CA in memory. The launcher's own (operator) identity is never
written. All processes of a local run run as the same user: file modes keep other users out, not one component out
of another's folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlfleet.security.identity import Identity
from rlfleet.security.pki import CA_CERT, CertAuthority, create_ca, issue, write_identity

KEEP = frozenset({"openai-api.key", "weights-signing.pub", "signing"})   # run material that is not an identity
DIR_MODE = 0o700


def role_of(name: str) -> str | None:
    """The role of a local run's process by its name; None for one that presents no certificate (the gateway)."""
    if name.startswith("trainer-"):
        return "trainer"
    if name.startswith("rollout-"):
        return "rollout"
    return name if name in ("buffer", "weight_sync", "controller", "operator") else None


def clear_identities(root: Path) -> None:
    """Remove the identities (and any CA key) an earlier launch, or an earlier layout, left in `root`."""
    for entry in root.iterdir():
        if entry.name in KEEP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.suffix in (".key", ".crt", ".tmp") or entry.name.startswith("."):
            entry.unlink()


class LocalPki:
    """A fresh run CA held in memory, issuing one folder per process under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(DIR_MODE)
        clear_identities(self.root)
        self._ca: CertAuthority = create_ca()
        (self.root / CA_CERT).write_bytes(self._ca.cert_pem)
        self._issued: dict[str, Path] = {}

    @property
    def ca_pem(self) -> bytes:
        return self._ca.cert_pem

    def issue(self, role: str, name: str) -> Path:
        """The folder holding `name`'s certificate and key (made on the first call of this launch)."""
        if name in self._issued:
            return self._issued[name]
        folder = self.root / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(mode=DIR_MODE)
        folder.chmod(DIR_MODE)
        write_identity(folder, name, issue(self._ca, role, name))
        (folder / CA_CERT).write_bytes(self._ca.cert_pem)
        self._issued[name] = folder
        return folder

    def in_memory(self, role: str, name: str) -> Identity:
        """An identity that is never written (the launcher's own)."""
        issued = issue(self._ca, role, name)
        return Identity(role=role, name=name, key_pem=issued.key_pem, cert_pem=issued.cert_pem,
                        ca_pem=self._ca.cert_pem)
