"""The run CA and one certificate per component, made with `cryptography` (ECDSA P-256, X.509).

A component's identity is its role and name, carried in the certificate as the URI SAN
`spiffe://rlfleet/<role>/<name>` (the CN is the name). Server certificates also name 127.0.0.1, ::1, localhost and
any extra hosts given, so channels verify the server against the address they dial.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlfleet.security.secret_files import write_secret

URI_PREFIX = "spiffe://rlfleet/"
CA_CERT = "ca.crt"
ROLES = ("trainer", "rollout", "buffer", "weight_sync", "controller", "operator")


@dataclass(frozen=True)
class IssuedCert:
    key_pem: bytes
    cert_pem: bytes


@dataclass(frozen=True)
class CertAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def create_ca(common_name: str = "rlfleet run CA", days: float = 30.0) -> CertAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now() - dt.timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return CertAuthority(key, cert)


def identity_uri(role: str, name: str) -> str:
    return f"{URI_PREFIX}{role}/{name}"


def issue(ca: CertAuthority, role: str, name: str, hosts: Iterable[str] = (), days: float = 30.0,
          not_before: dt.datetime | None = None) -> IssuedCert:
    """A key and a certificate for component `name` with `role`, usable as both TLS server and client."""
    if role not in ROLES:
        raise ValueError(f"unknown role '{role}' (roles: {', '.join(ROLES)})")
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or (_now() - dt.timedelta(minutes=5))
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, name)),
                                    x509.DNSName("localhost"), x509.DNSName(name.replace("_", "-")),
                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                    x509.IPAddress(ipaddress.ip_address("::1"))]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    return IssuedCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def cert_paths(folder: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) file of component `name` in a PKI folder."""
    return Path(folder) / f"{name}.crt", Path(folder) / f"{name}.key"


def write_identity(folder: Path, name: str, issued: IssuedCert) -> None:
    crt, key = cert_paths(folder, name)
    write_secret(key, issued.key_pem)
    crt.write_bytes(issued.cert_pem)


def create_run_pki(folder: Path, components: Iterable[tuple[str, str]], hosts: Iterable[str] = ()) -> Path:
    """A fresh CA (its key never written) and a certificate per (role, name) component, all in `folder` (the layout
    the chart mounts: ca.crt, NAME.crt, NAME.key). A local run gives each process a folder of its own instead
    (rlfleet/security/local_pki.py)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca = create_ca()
    hosts = list(hosts)
    for role, name in components:
        write_identity(folder, name, issue(ca, role, name, hosts))
    (folder / CA_CERT).write_bytes(ca.cert_pem)
    return folder
