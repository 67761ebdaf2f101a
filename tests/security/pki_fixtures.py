"""Certificates for security tests: a run CA with one identity per role, a foreign CA, an expired certificate."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from rlfleet.security.identity import Identity
from rlfleet.security.pki import CertAuthority, create_ca, issue

ROLE_NAMES = {"trainer": "trainer-0", "rollout": "rollout-0", "buffer": "buffer", "weight_sync": "weight_sync",
              "controller": "controller", "operator": "operator"}


@dataclass(frozen=True)
class RunPki:
    ca: CertAuthority
    foreign: CertAuthority
    good: dict[str, Identity]          # role -> identity under the run CA
    wrong_ca: dict[str, Identity]      # role -> identity under another CA (presented with the run CA as trust root)
    expired: dict[str, Identity]       # role -> identity under the run CA, expired yesterday


def _identity(ca: CertAuthority, trust: CertAuthority, role: str, name: str, **kw: object) -> Identity:
    got = issue(ca, role, name, **kw)  # type: ignore[arg-type]
    return Identity(role=role, name=name, key_pem=got.key_pem, cert_pem=got.cert_pem, ca_pem=trust.cert_pem)


def make_pki() -> RunPki:
    ca, foreign = create_ca(), create_ca("another CA")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    return RunPki(
        ca=ca, foreign=foreign,
        good={r: _identity(ca, ca, r, n) for r, n in ROLE_NAMES.items()},
        wrong_ca={r: _identity(foreign, ca, r, n) for r, n in ROLE_NAMES.items()},
        expired={r: _identity(ca, ca, r, n, days=1, not_before=past) for r, n in ROLE_NAMES.items()},
    )
