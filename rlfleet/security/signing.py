"""Ed25519 signatures over weight versions and checkpoints; BLAKE3 digests of tensors and files.

A weight version is signed over its canonical statement: version, epoch, step, adapter flag, options and, per tensor,
name, dtype, shape, byte count and BLAKE3 digest (not the transport's routing fields: a changed endpoint or bucket
placement can only make the bytes disagree with the signed digests). The key lives with the trainer only; replicas
hold the public key and refuse a version that is unsigned, signed by another key, or whose tensors hash otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rlfleet.security.secret_files import read_secret, write_secret

if TYPE_CHECKING:       # imported where tensors are hashed: the launcher loads this module for keys alone
    import torch

SIGNING_KEY_ENV = "RLFLEET_SIGNING_KEY"    # `rlfleet run` names its signing key to the trainer ranks alone, here
WEIGHTS_CONTEXT = b"rlfleet weights v1\0"
CHECKPOINT_CONTEXT = b"rlfleet checkpoint v1\0"


class SignatureError(ValueError):
    """Unsigned, wrongly signed, or content that does not hash to what was signed."""


# below this a tensor is hashed on the calling thread: handing small inputs to blake3's thread pool costs more than it
# saves (the addition model's 38 tensors, 2.6 MB, on one Zen 4 core: 0.55 ms on one thread, 0.94 ms with AUTO)
PARALLEL_HASH_BYTES = 1 << 20


def tensor_blake3(t: torch.Tensor) -> str:
    """BLAKE3 of a tensor's raw bytes (contiguous, on CPU)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    data = memoryview(t.view(torch.uint8).numpy()).cast("B") if t.numel() else b""
    threads = blake3.blake3.AUTO if len(data) >= PARALLEL_HASH_BYTES else 1
    return blake3.blake3(data, max_threads=threads).hexdigest()


def file_blake3(path: Path) -> str:
    h = blake3.blake3()
    with Path(path).open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def generate_signing_key(private_path: Path, public_path: Path) -> None:
    """A fresh Ed25519 key pair: the private key 0600 (atomic exclusive create), the public key beside it."""
    key = Ed25519PrivateKey.generate()
    write_secret(private_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    Path(public_path).write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))


@dataclass(frozen=True)
class Signer:
    key: Ed25519PrivateKey

    @classmethod
    def from_file(cls, path: str | Path) -> Signer:
        key = serialization.load_pem_private_key(read_secret(Path(path)), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SignatureError(f"{path}: not an Ed25519 private key")
        return cls(key)

    def sign(self, context: bytes, statement: bytes) -> bytes:
        return self.key.sign(context + statement)


@dataclass(frozen=True)
class Verifier:
    key: Ed25519PublicKey

    @classmethod
    def from_file(cls, path: str | Path) -> Verifier:
        """A public key PEM, or a certificate PEM carrying one (the chart's signing Certificate, tls.crt)."""
        data = Path(path).read_bytes()
        key = (x509.load_pem_x509_certificate(data).public_key() if b"-----BEGIN CERTIFICATE-----" in data
               else serialization.load_pem_public_key(data))
        if not isinstance(key, Ed25519PublicKey):
            raise SignatureError(f"{path}: not an Ed25519 public key")
        return cls(key)

    def check(self, context: bytes, statement: bytes, signature: bytes, what: str) -> None:
        if not signature:
            raise SignatureError(f"{what} is unsigned")
        try:
            self.key.verify(signature, context + statement)
        except InvalidSignature:
            raise SignatureError(f"{what}: signature does not verify with the run's public key") from None


# ---- weight manifests --------------------------------------------------------------------------------------------

def manifest_statement(manifest: Any) -> bytes:
    """The canonical bytes a weight manifest's signature covers."""
    body = {"version": int(manifest.version), "epoch": int(manifest.epoch), "step": int(manifest.step),
            "adapter_only": bool(manifest.adapter_only),
            "options": dict(sorted(manifest.options.items())),
            "tensors": [[e.name, e.dtype, [int(d) for d in e.shape], int(e.nbytes), e.blake3]
                        for e in manifest.tensors]}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class HashingTee:
    """Passes (name, tensor) through to a sender unchanged, recording each tensor's BLAKE3 on the way.

    Keeps `specs` of what it wraps (a ShardedState plans buckets from it), so a sender sees no difference. (Hashing on
    a helper thread while the sender copies was tried: no gain measured, bench/security_overhead.py.)
    """

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._items = items
        self.digests: dict[str, str] = {}
        specs = getattr(items, "specs", None)
        if specs is not None:
            self.specs = specs

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.digests = {}
        for name, t in self._items:
            self.digests[name] = tensor_blake3(t)
            yield name, t


class HashedTensors(list[tuple[str, "torch.Tensor"]]):
    """Received (name, tensor) pairs with the BLAKE3 of each, computed by the receiver from these very bytes while
    they arrived (the bucketed transport hashes a tensor on a helper thread as soon as its bytes are in), so
    verify_weights checks the signed digests without hashing them again."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]], blake3_hex: dict[str, str]) -> None:
        super().__init__(items)
        self.blake3 = dict(blake3_hex)


def sign_manifest(manifest: Any, digests: dict[str, str], signer: Signer) -> None:
    """Fill every tensor entry's blake3 from `digests` (name -> hex) and sign the manifest in place."""
    missing = [e.name for e in manifest.tensors if e.name not in digests]
    if missing:
        raise SignatureError(f"no BLAKE3 digest recorded for {len(missing)} tensors (first: {missing[0]})")
    for e in manifest.tensors:
        e.blake3 = digests[e.name]
    manifest.signature = signer.sign(WEIGHTS_CONTEXT, manifest_statement(manifest))


def verify_manifest(manifest: Any, verifier: Verifier) -> None:
    """Raise SignatureError unless the manifest's statement (version, epoch, tensor list and digests) is signed by
    the run's key. A replica checks it before anything else: before it changes any state or allocates a byte."""
    verifier.check(WEIGHTS_CONTEXT, manifest_statement(manifest), manifest.signature,
                   f"weight version {manifest.version} (epoch {manifest.epoch})")


def verify_weights(manifest: Any, tensors: Sequence[tuple[str, torch.Tensor]], verifier: Verifier) -> None:
    """Raise SignatureError unless the manifest is signed by the run's key and every tensor hashes to its entry
    (HashedTensors: to the digest its receiver computed from the received bytes)."""
    what = f"weight version {manifest.version}"
    verify_manifest(manifest, verifier)
    entries = list(manifest.tensors)
    if [n for n, _ in tensors] != [e.name for e in entries]:
        raise SignatureError(f"{what}: received tensors are not the signed list")
    for (name, t), e in zip(tensors, entries, strict=True):
        if list(t.shape) != [int(d) for d in e.shape] or str(t.dtype).removeprefix("torch.") != e.dtype:
            raise SignatureError(f"{what}: tensor {name} is {t.dtype}{list(t.shape)}, signed {e.dtype}{list(e.shape)}")
        got = tensors.blake3.get(name) if isinstance(tensors, HashedTensors) else None
        if (got if got is not None else tensor_blake3(t)) != e.blake3:
            raise SignatureError(f"{what}: tensor {name} does not hash to its signed BLAKE3 digest")


# ---- checkpoints -------------------------------------------------------------------------------------------------

def sign_file(path: Path, signer: Signer) -> bytes:
    return signer.sign(CHECKPOINT_CONTEXT, Path(path).read_bytes())


def verify_file(path: Path, signature: bytes, verifier: Verifier) -> None:
    verifier.check(CHECKPOINT_CONTEXT, Path(path).read_bytes(), signature, str(path))


def weight_verifier(security: Any) -> Verifier | None:
    """The run's verifier when a signing public key is configured (replicas then refuse unsigned versions)."""
    return Verifier.from_file(security.signing_public_key) if security.signing_public_key else None
