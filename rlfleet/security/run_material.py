"""What `rlfleet run` makes in the run folder for the security mode: certificates, the signing key, or a token."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any

from rlfleet.config import Config
from rlfleet.security.credentials import NO_AUTH_WARNING
from rlfleet.security.identity import IDENTITY_DIR_ENV, IDENTITY_ENV
from rlfleet.security.local_pki import LocalPki, role_of
from rlfleet.security.modes import security_mode
from rlfleet.security.secret_files import write_secret
from rlfleet.security.signing import SIGNING_KEY_ENV, generate_signing_key

log = logging.getLogger("rlfleet.security")

PKI_DIR = "pki"
SIGNING_DIR = "signing"
SIGNING_KEY = "weights-signing.key"
SIGNING_PUB = "weights-signing.pub"
OPENAI_API_KEY = "openai-api.key"       # rollout.openai in mtls mode: the bearer key of the replicas' HTTP endpoint


def components(cfg: Config) -> list[tuple[str, str]]:
    """(role, name) of each process a local run starts with that presents a certificate (the launcher's own,
    operator, is held in its memory only)."""
    return ([("trainer", f"trainer-{r}") for r in range(cfg.trainer.world_size)]
            + [("rollout", f"rollout-{i}") for i in range(cfg.rollout.replicas)]
            + [("buffer", "buffer"), ("weight_sync", "weight_sync")])


def prepare_security(cfg: Config, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """The resolved `security` section, after making what its mode needs in the run folder.

    mtls: pki_dir is RUN/pki/ (0700), which holds only public material and, with rollout.openai.enabled, the
    endpoint's API key openai-api.key (0600; made fresh by each launch, kept by a `resume`); the run CA and each
    process's own folder are made by the launcher (rlfleet/security/local_pki.py), the CA key in its memory only.
    Every mode but none: an Ed25519 weight-signing key pair, the private key in RUN/pki/signing/ (0700, 0600), named
    to the trainer processes alone (RLFLEET_SIGNING_KEY, not in the shared config); token: RUN/run.token (0600).
    """
    sec = cfg.security.model_dump()
    mode = security_mode(cfg.security.mode)
    if not mode.authenticates:
        log.warning("rlfleet run: %s", NO_AUTH_WARNING)
        print(f"rlfleet: WARNING: {NO_AUTH_WARNING}")
        return sec
    pki = run_dir / PKI_DIR
    if mode.uses_pki and not cfg.security.pki_dir:
        _private_dir(pki)
        sec["pki_dir"] = str(pki.resolve())
    if mode.uses_token and not cfg.security.token_file:
        token_file = run_dir / "run.token"
        if not (resume and token_file.is_file()):          # a resume keeps it (the OpenAI endpoint's key too)
            write_secret(token_file, secrets.token_urlsafe(32).encode())
        sec["token_file"] = str(token_file.resolve())
    key_file = Path(str(sec.get("pki_dir") or "")) / OPENAI_API_KEY
    if mode.uses_pki and cfg.rollout.openai.enabled and not cfg.rollout.openai.api_key_file \
            and not (resume and key_file.is_file()):
        # a fresh key at every launch but a resume (which keeps it: an agent outside the run reconnects with it)
        write_secret(key_file, secrets.token_urlsafe(32).encode())
    if not cfg.security.signing_key and not cfg.security.signing_public_key:
        private = launcher_signing_key(run_dir)
        _private_dir(private.parent)
        legacy = pki / SIGNING_KEY                    # where earlier versions kept it, beside every other key
        if legacy.exists() and not private.exists():
            os.replace(legacy, private)
        if not private.exists():                     # kept across --resume: checkpoints stay verifiable
            generate_signing_key(private, pki / SIGNING_PUB)
        sec["signing_public_key"] = str((pki / SIGNING_PUB).resolve())
    return sec


def launcher_signing_key(run_dir: Path) -> Path:
    """The weight-signing private key `rlfleet run` makes (when the config names none)."""
    return run_dir / PKI_DIR / SIGNING_DIR / SIGNING_KEY


def _private_dir(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)


def child_secret_env(cfg: Config, name: str, pki: LocalPki | None) -> dict[str, str]:
    """What a child process is told about keys: its own identity folder (mtls) and, for a trainer rank, the
    launcher-made signing key; nothing of any other process's. A replica added later (`rlfleet scale`) is issued
    its certificate here, from the CA in the launcher's memory."""
    env: dict[str, str] = {}
    role = role_of(name)
    if security_mode(cfg.security.mode).uses_pki and role is not None:
        env[IDENTITY_ENV] = name
        if pki is not None:
            env[IDENTITY_DIR_ENV] = str(pki.issue(role, name).resolve())
    signing = launcher_signing_key(cfg.run_dir)
    if role == "trainer" and not cfg.security.signing_key and signing.exists():
        env[SIGNING_KEY_ENV] = str(signing.resolve())
    return env
