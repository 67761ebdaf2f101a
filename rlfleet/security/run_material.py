"""What `rlfleet run` makes in the run folder for the security mode: certificates, the signing key, or a token."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from rlfleet.config import Config
from rlfleet.security.credentials import NO_AUTH_WARNING
from rlfleet.security.identity import IDENTITY_ENV
from rlfleet.security.modes import security_mode
from rlfleet.security.pki import cert_paths, create_run_pki, issue_into
from rlfleet.security.secret_files import write_secret
from rlfleet.security.signing import generate_signing_key

log = logging.getLogger("rlfleet.security")

PKI_DIR = "pki"
SIGNING_KEY = "weights-signing.key"
SIGNING_PUB = "weights-signing.pub"
OPENAI_API_KEY = "openai-api.key"       # rollout.openai in mtls mode: the bearer key of the replicas' HTTP endpoint


def components(cfg: Config) -> list[tuple[str, str]]:
    """(role, name) of every component of a local run: each trainer rank and rollout replica on its own."""
    return ([("trainer", f"trainer-{r}") for r in range(cfg.trainer.world_size)]
            + [("rollout", f"rollout-{i}") for i in range(cfg.rollout.replicas)]
            + [("buffer", "buffer"), ("weight_sync", "weight_sync"), ("controller", "controller"),
               ("operator", "operator")])


def prepare_security(cfg: Config, run_dir: Path) -> dict[str, Any]:
    """The resolved `security` section, after making what its mode needs in the run folder.

    mtls: a fresh run CA (its key is never written) and one certificate per component in RUN/pki/, and with
    rollout.openai.enabled the endpoint's API key RUN/pki/openai-api.key (0600); every mode but none: an Ed25519
    weight-signing key pair (private key 0600, for the trainer); token: RUN/run.token (0600).
    """
    sec = cfg.security.model_dump()
    mode = security_mode(cfg.security.mode)
    if not mode.authenticates:
        log.warning("rlfleet run: %s", NO_AUTH_WARNING)
        print(f"rlfleet: WARNING: {NO_AUTH_WARNING}")
        return sec
    pki = run_dir / PKI_DIR
    if mode.uses_pki and not cfg.security.pki_dir:
        create_run_pki(pki, components(cfg))
        sec["pki_dir"] = str(pki.resolve())
    if mode.uses_token and not cfg.security.token_file:
        token_file = run_dir / "run.token"
        write_secret(token_file, secrets.token_urlsafe(32).encode())
        sec["token_file"] = str(token_file.resolve())
    if mode.uses_pki and cfg.rollout.openai.enabled and not cfg.rollout.openai.api_key_file:
        # a fresh key at every launch, as the run CA: a key of an earlier launch stops being accepted
        write_secret(Path(sec["pki_dir"]) / OPENAI_API_KEY, secrets.token_urlsafe(32).encode())
    if not cfg.security.signing_key and not cfg.security.signing_public_key:
        keys = run_dir / PKI_DIR
        keys.mkdir(parents=True, exist_ok=True)
        keys.chmod(0o700)
        if not (keys / SIGNING_KEY).exists():        # kept across --resume: checkpoints stay verifiable
            generate_signing_key(keys / SIGNING_KEY, keys / SIGNING_PUB)
        sec["signing_key"] = str((keys / SIGNING_KEY).resolve())
        sec["signing_public_key"] = str((keys / SIGNING_PUB).resolve())
    return sec


def child_identity_env(cfg: Config, name: str) -> dict[str, str]:
    """The environment naming which certificate a child process presents (mtls mode); a rollout replica added
    after start-up (`rlfleet scale`) gets its certificate issued here."""
    if not security_mode(cfg.security.mode).uses_pki:
        return {}
    pki = Path(cfg.security.pki_dir) if cfg.security.pki_dir else None
    if pki is not None and name.startswith("rollout-") and not cert_paths(pki, name)[0].exists():
        issue_into(pki, "rollout", name)
    return {IDENTITY_ENV: name}
