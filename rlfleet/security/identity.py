"""What a process presents on the wire (its credential), and the identity a server reads from a peer.

A `Credential` is one of: an `Identity` (mTLS: key, certificate and the run CA), a str (the shared run token of
`security.mode: token`), or None (`security.mode: none`). Servers and channels (rlfleet.runtime.rpc) take any of the
three.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from rlfleet.security.pki import CA_CERT, URI_PREFIX, cert_paths
from rlfleet.security.secret_files import read_secret

IDENTITY_ENV = "RLFLEET_IDENTITY"      # which certificate of the PKI folder this process presents
IDENTITY_DIR_ENV = "RLFLEET_IDENTITY_DIR"   # a local run: the folder holding this process's own key, and no other


class IdentityError(RuntimeError):
    """A certificate or key that is missing, unreadable or names no rlfleet identity."""


@dataclass(frozen=True)
class Identity:
    role: str
    name: str
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes


Credential = Identity | str | None


@dataclass(frozen=True)
class Peer:
    """The caller a server sees: role and name from its certificate (mTLS) or ('token', '') / ('none', '')."""

    role: str
    name: str


def role_and_name(cert_pem: bytes) -> tuple[str, str]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError("certificate has no subject alternative names") from None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(URI_PREFIX):
            role, _, name = uri.removeprefix(URI_PREFIX).partition("/")
            return role, name
    raise IdentityError(f"certificate names no {URI_PREFIX}<role>/<name> identity")


def load_identity(folder: str | Path, name: str) -> Identity:
    """Component `name`'s identity from a PKI folder ({name}.crt, {name}.key 0600, ca.crt)."""
    crt, key = cert_paths(Path(folder), name)
    try:
        cert_pem = crt.read_bytes()
        key_pem = read_secret(key)
        ca_pem = (Path(folder) / CA_CERT).read_bytes()
    except OSError as exc:
        raise IdentityError(f"identity '{name}' in {folder}: {exc}") from None
    role, cert_name = role_and_name(cert_pem)
    return Identity(role=role, name=cert_name, key_pem=key_pem, cert_pem=cert_pem, ca_pem=ca_pem)


def identity_name(service: str, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The certificate a service process presents: RLFLEET_IDENTITY, else trainer-<RANK> or the service name."""
    if env.get(IDENTITY_ENV):
        return env[IDENTITY_ENV]
    if service == "trainer":
        return f"trainer-{env.get('RANK', '0')}"
    return service


def identity_folder(pki_dir: str | Path, env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where this process's certificate and key are: RLFLEET_IDENTITY_DIR (`rlfleet run` gives each process a folder
    of its own), else security.pki_dir (the chart's mounted Secret or csi volume)."""
    return Path(env.get(IDENTITY_DIR_ENV) or pki_dir)


def peer_of(context: Any) -> Peer | None:
    """The mTLS peer of a servicer context (None when the connection carries no verified rlfleet identity)."""
    auth = context.auth_context()
    ids = auth.get("peer_spiffe_id") or [u for u in auth.get("x509_subject_alternative_name", [])
                                         if u.startswith(URI_PREFIX.encode())]
    if not ids:
        return None
    uri = ids[0].decode()
    if not uri.startswith(URI_PREFIX):
        return None
    role, _, name = uri.removeprefix(URI_PREFIX).partition("/")
    return Peer(role, name) if role and name else None
