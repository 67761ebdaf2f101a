"""How the OpenAI endpoint authenticates, by security.mode (what "authenticated like the rest of the run" means):

- mtls (default): clients send the run's API key as a bearer token, RUN_DIR/pki/openai-api.key (0600, made fresh by
  each `rlfleet run`, like the run CA; or rollout.openai.api_key_file, which may list several keys, one a line: one
  per tenant, each owning the sessions it opens, the first the one rollout functions use). Bound beyond loopback,
  the endpoint also speaks HTTPS with the replica's run-CA certificate, so clients verify it with RUN_DIR/pki/ca.crt.
- token: the bearer key is the run token itself (the credential every gRPC call of the run carries).
- none: no key, plain HTTP (explicit local experiments only, as for the gRPC services).
"""

from __future__ import annotations

from pathlib import Path

from rlfleet.config import Config, ConfigError
from rlfleet.security.identity import Credential, identity_folder
from rlfleet.security.modes import security_mode
from rlfleet.security.pki import cert_paths
from rlfleet.security.run_material import OPENAI_API_KEY
from rlfleet.security.secret_files import read_secret

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def api_keys(cfg: Config, credential: Credential) -> tuple[str, ...] | None:
    """The bearer keys the endpoint accepts; None in mode none. ConfigError when mtls's key file is missing."""
    mode = security_mode(cfg.security.mode)
    if not mode.authenticates:
        return None
    if mode.uses_token:
        if not isinstance(credential, str) or not credential:
            raise ConfigError(f"rollout.openai: security.mode is '{mode.name}' but this replica holds no run token")
        return (credential,)
    configured = cfg.rollout.openai.api_key_file              # mode.uses_pki: a key file of its own
    if not configured and not cfg.security.pki_dir:
        raise ConfigError(f"rollout.openai: security.mode is '{mode.name}' but neither rollout.openai.api_key_file "
                          "nor security.pki_dir is set (rlfleet run makes RUN_DIR/pki/openai-api.key)")
    path = Path(configured) if configured else Path(str(cfg.security.pki_dir)) / OPENAI_API_KEY
    try:
        text = read_secret(path).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rollout.openai: the API key file {path}: {exc}") from None
    keys = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    if not keys:
        raise ConfigError(f"rollout.openai: the API key file {path} is empty")
    return keys


def tls_files(cfg: Config, replica_id: str) -> tuple[Path, Path] | None:
    """(certificate, key) for HTTPS: mtls mode with the endpoint bound beyond loopback; else None (plain HTTP)."""
    if not security_mode(cfg.security.mode).uses_pki or cfg.rollout.openai.bind in LOOPBACK \
            or not cfg.security.pki_dir:
        return None
    return cert_paths(identity_folder(cfg.security.pki_dir), replica_id)
