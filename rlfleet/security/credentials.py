"""The credential a service process presents, from the run config's `security` section."""

from __future__ import annotations

import logging
import os

from rlfleet.config import ConfigError, SecurityConfig
from rlfleet.security.identity import Credential, IdentityError, identity_folder, identity_name, load_identity
from rlfleet.security.modes import security_mode

log = logging.getLogger("rlfleet.security")

NO_AUTH_WARNING = ("security.mode is 'none': every RPC of this service is open to anyone who can reach its port, "
                   "unencrypted; use it only for local experiments")


def read_token(token_file: str | None) -> str | None:
    """The shared run token (token mode). RLFLEET_TOKEN overrides the file."""
    if os.environ.get("RLFLEET_TOKEN"):
        return os.environ["RLFLEET_TOKEN"]
    if token_file is None:
        return None
    with open(token_file) as f:
        return f.read().strip()


def load_credential(security: SecurityConfig, service: str, name: str | None = None) -> Credential:
    """mtls: the Identity of `name` (default: RLFLEET_IDENTITY, trainer-<RANK> or the service name) from
    RLFLEET_IDENTITY_DIR or security.pki_dir; token: the run token; none: None, with a warning. ConfigError when
    the mode's material is missing."""
    mode = security_mode(security.mode)
    if not mode.authenticates:
        log.warning("%s: %s", service, NO_AUTH_WARNING)
        return None
    if mode.uses_token:
        token = read_token(security.token_file)
        if not token:
            raise ConfigError(f"{service}: security.mode is '{mode.name}' but no token (security.token_file or "
                              "RLFLEET_TOKEN)")
        return token
    if not security.pki_dir:                                # mode.uses_pki
        raise ConfigError(f"{service}: security.mode is '{mode.name}' but security.pki_dir is not set (rlfleet run "
                          "makes one in the run folder; set security.mode: none explicitly to run without)")
    try:
        return load_identity(identity_folder(security.pki_dir), name or identity_name(service))
    except IdentityError as exc:
        raise ConfigError(f"{service}: {exc}") from None
