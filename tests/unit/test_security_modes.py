"""Every security.mode a config can name has its record in rlfleet/security/modes.py, and the records keep the rule
the places that act on the mode rely on: an authenticating mode has exactly one credential (run token or PKI)."""

from __future__ import annotations

import typing

import pytest

from rlfleet.config import ConfigError, SecurityConfig
from rlfleet.security.modes import SECURITY_MODES, security_mode


def test_every_configurable_security_mode_is_registered() -> None:
    assert set(typing.get_args(SecurityConfig.model_fields["mode"].annotation)) == set(SECURITY_MODES) == {
        "mtls", "token", "none"}
    assert all(m.name == name and m.description for name, m in SECURITY_MODES.items())
    with pytest.raises(ConfigError, match="unknown security.mode 'rot13'"):
        security_mode("rot13")


def test_an_authenticating_mode_has_exactly_one_credential() -> None:
    for mode in SECURITY_MODES.values():
        assert int(mode.uses_token) + int(mode.uses_pki) == int(mode.authenticates), mode
    assert security_mode("mtls").uses_pki and security_mode("token").uses_token
    assert not security_mode("none").authenticates
