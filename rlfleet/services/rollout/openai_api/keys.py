"""The bearer keys an OpenAI endpoint (or the gateway) accepts, and which of them a request carries.

A run has one key (credentials.py); `rollout.openai.api_key_file` may list several, one a line, one per tenant. Each
key owns the sessions opened with it (sessions.py): its owner id is a digest of the key, the same on every replica
whatever the order of the file, and never the key itself. Keys are compared in constant time, all of them each time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence


def owner_id(key: str) -> str:
    """What a session records of the key that opened it."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class ApiKeys:
    """keys: None or empty for no authentication (security.mode none)."""

    def __init__(self, keys: str | Sequence[str] | None) -> None:
        listed = [keys] if isinstance(keys, str) else list(keys or ())
        if any(not k or k != k.strip() for k in listed):
            raise ValueError("an API key must be non-empty and have no surrounding whitespace")
        self._expected = [f"Bearer {k}".encode() for k in listed]
        self._owners = [owner_id(k) for k in listed]

    @property
    def required(self) -> bool:
        return bool(self._expected)

    def owner(self, authorization: str) -> str | None:
        """The owner id of the key the Authorization header carries; None when it carries none of them (or no key
        is required: then every request is the same, anonymous owner)."""
        got = authorization.encode()
        found = None
        for expected, owner in zip(self._expected, self._owners, strict=True):
            if hmac.compare_digest(got, expected):
                found = owner
        return found

    def allows(self, authorization: str) -> bool:
        return not self.required or self.owner(authorization) is not None
