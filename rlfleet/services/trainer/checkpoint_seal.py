"""Signed checkpoints: rank 0 seals a finished checkpoint folder (BLAKE3 of every file, Ed25519 over the list) and a
resume takes the newest checkpoint whose seal verifies with the run's public key, so a folder planted on the
checkpoint volume (by anything but the trainer) is never loaded.

    step_XXXXXXXX/seal.json   {"files": {relative path: blake3 hex}}   (every file but the seal itself)
    step_XXXXXXXX/seal.sig    Ed25519 signature over seal.json
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlfleet.run_dir.atomic import write_bytes_atomic, write_text_atomic
from rlfleet.security.signing import SignatureError, Signer, Verifier, file_blake3, sign_file, verify_file
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.checkpoint import CheckpointInfo

log = logging.getLogger(__name__)

SEAL, SEAL_SIG = "seal.json", "seal.sig"


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): file_blake3(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (SEAL, SEAL_SIG)}


def seal(folder: Path, signer: Signer) -> None:
    """Write seal.json and its signature (after the checkpoint folder is complete)."""
    write_text_atomic(folder / SEAL, json.dumps({"files": _digests(folder)}, indent=0, sort_keys=True))
    write_bytes_atomic(folder / SEAL_SIG, sign_file(folder / SEAL, signer))


def check_seal(folder: Path, verifier: Verifier) -> None:
    """Raise SignatureError unless the folder's seal verifies and every file (no more, no fewer) matches it."""
    if not (folder / SEAL).is_file() or not (folder / SEAL_SIG).is_file():
        raise SignatureError(f"checkpoint {folder} is not sealed by the trainer (no {SEAL} / {SEAL_SIG})")
    verify_file(folder / SEAL, (folder / SEAL_SIG).read_bytes(), verifier)
    want = json.loads((folder / SEAL).read_text())["files"]
    got = _digests(folder)
    if got != want:
        bad = sorted(set(got) ^ set(want) | {k for k in got if k in want and got[k] != want[k]})
        raise SignatureError(f"checkpoint {folder}: files differ from its seal ({', '.join(bad[:5])})")


def latest_sealed(run_dir: Path, verifier: Verifier | None) -> CheckpointInfo | None:
    """checkpoint.latest, or with a verifier the newest complete checkpoint whose seal verifies (others logged)."""
    if verifier is None:
        return checkpoint.latest(run_dir)
    for info in checkpoint._complete(checkpoint.checkpoints_dir(run_dir)):
        try:
            check_seal(info.path, verifier)
            return info
        except (SignatureError, OSError, ValueError, KeyError) as exc:
            log.error("not resuming from %s: %s", info.path, exc)
    return None
