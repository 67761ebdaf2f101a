"""Credentials out of the environment: once a service has read them, plugins and child processes cannot."""

from __future__ import annotations

import os
from urllib.parse import quote, urlsplit, urlunsplit

SECRET_ENV = ("RLFLEET_TOKEN", "RLFLEET_REDIS_PASSWORD_FILE", "RLFLEET_REDIS_USERNAME", "SGLANG_API_KEY",
              "RLFLEET_SIGNING_KEY")


def scrub_environment(env: os._Environ[str] | dict[str, str] = os.environ) -> dict[str, str]:
    """Remove the credential variables from `env` (the process environment by default); returns what was there."""
    return {k: env.pop(k) for k in SECRET_ENV if k in env}


def redis_url_with_credentials(url: str, username: str | None, password_file: str | None) -> str:
    """`url` with the ACL user and the password read from a mounted Secret file (never written to the config)."""
    if not password_file:
        return url
    with open(password_file) as f:
        password = f.read().strip()
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{quote(username or 'default', safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
