"""The security section: authentication, roles and signed weights."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.config.section import Section


class SecurityConfig(Section):
    """Authentication between the services, and signed weights."""

    mode: Literal["mtls", "token", "none"] = Field(
        "mtls", description="mtls: a run CA and a certificate per component, roles per RPC (rlfleet/security); "
        "token: one shared token, no roles, no TLS; none: nothing (explicit local experiments only; every service "
        "warns).")
    token_file: str | None = Field(None, description="token mode: the file holding the token (the launcher writes "
                                   "a fresh one in the run folder).")
    pki_dir: str | None = Field(None, description="mtls: ca.crt, NAME.crt, NAME.key (0600); the launcher makes "
                                "them.")
    signing_key: str | None = Field(None, description="Ed25519 private key (PEM) signing weights/checkpoints: "
                                    "trainer only.")
    signing_public_key: str | None = Field(None, description="Its public key: replicas and the trainer refuse what "
                                           "it did not sign.")
    version_lead: int = Field(1, ge=0, description="Put/Claim weight_version may lead the trainer's policy version "
                              "by this.")
    metrics_bind: str = Field("127.0.0.1", description="Where /metrics listens (the chart sets 0.0.0.0 for "
                              "Prometheus).")
