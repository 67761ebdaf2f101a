"""The one table of security modes (security.mode): what each mode needs of the run folder and what it does, so the
places that act on the mode (a service's credential, `rlfleet run`'s run material, the OpenAI endpoint's key and TLS,
the weight data plane) ask the mode's record instead of comparing its name.

An authenticating mode has exactly one credential: the shared run token (uses_token) or a certificate of the run CA
(uses_pki); the mode that does not authenticate has none, and every service warns about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rlfleet.config import ConfigError


@dataclass(frozen=True)
class SecurityMode:
    """One security mode. authenticates: every RPC carries a credential the server checks (and the run signs its
    weights); uses_token: that credential is the shared run token (security.token_file or RLFLEET_TOKEN), also the
    OpenAI endpoint's bearer key; uses_pki: it is a certificate of the run CA (security.pki_dir, mutual TLS with roles
    per RPC), and the OpenAI endpoint has its own key file and speaks HTTPS beyond loopback."""

    name: str
    description: str
    authenticates: bool
    uses_token: bool = False
    uses_pki: bool = False


SECURITY_MODES: Mapping[str, SecurityMode] = MappingProxyType({m.name: m for m in (
    SecurityMode("mtls", "a run CA and a certificate per component, roles per RPC", authenticates=True,
                 uses_pki=True),
    SecurityMode("token", "one shared token, no roles, no TLS", authenticates=True, uses_token=True),
    SecurityMode("none", "nothing: explicit local experiments only; every service warns", authenticates=False),
)})


def security_mode(name: str) -> SecurityMode:
    """The mode called `name`; ConfigError naming the known ones otherwise."""
    found = SECURITY_MODES.get(name)
    if found is None:
        raise ConfigError(f"unknown security.mode '{name}' (available: {', '.join(SECURITY_MODES)})")
    return found
