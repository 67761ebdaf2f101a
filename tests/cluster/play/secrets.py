"""The Secrets `security.existingSecrets` names, made the way a user makes them for a cluster without cert-manager:
a run CA (rlfleet.security.pki, the CA `rlfleet run` makes locally) issues each component's certificate with the
identity and DNS names docs/cluster.md lists, and each Secret is a folder FOLDER/NAME/ holding one file per key
(`kubectl create secret generic NAME --from-file=tls.crt=... --from-file=tls.key=... --from-file=ca.crt=...`).
The weight-signing Secret holds an Ed25519 key (tls.key) and its public key (tls.crt). The CA's key is never
written: a later run makes a new CA.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlfleet.security.pki import create_ca, issue
from rlfleet.security.signing import generate_signing_key

# existingSecrets key -> (role, certificate name, component whose Service names it)
IDENTITIES = {"trainer": ("trainer", "trainer", "trainer"), "buffer": ("buffer", "buffer", "buffer"),
              "weightSync": ("weight_sync", "weight_sync", "weight-sync"),
              "controller": ("controller", "controller", ""), "rollout": ("rollout", "rollout-0", "rollout")}


def _write(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, data in files.items():
        (folder / key).write_bytes(data)
        (folder / key).chmod(0o600)


def make_existing_secrets(folder: Path, values: dict[str, Any], release: str, namespace: str) -> list[str]:
    """Write every Secret the values' security.existingSecrets and weightSigning.existingSecret name; returns
    their names. Secrets already in `folder` are replaced (one CA signs them all)."""
    sec = values.get("security", {})
    names: dict[str, str] = sec.get("existingSecrets") or {}
    missing = sorted(set(IDENTITIES) - set(names))
    if missing:
        raise ValueError(f"security.existingSecrets names no Secret for {missing}")
    ca = create_ca("rlfleet play run CA")
    made = []
    for key, (role, name, component) in IDENTITIES.items():
        svc = f"{release}-{component}.{namespace}.svc.cluster.local" if component else ""
        hosts = [f"*.{svc}" if key == "trainer" else svc] if svc else []
        issued = issue(ca, role, name, hosts=hosts)
        _write(folder / names[key], {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem})
        made.append(names[key])
    signing = sec.get("weightSigning", {})
    if signing.get("enabled", True) and signing.get("existingSecret"):
        with tempfile.TemporaryDirectory() as tmp:
            generate_signing_key(Path(tmp) / "k", Path(tmp) / "p")
            _write(folder / signing["existingSecret"],
                   {"tls.key": (Path(tmp) / "k").read_bytes(), "tls.crt": (Path(tmp) / "p").read_bytes()})
        made.append(signing["existingSecret"])
    return made
