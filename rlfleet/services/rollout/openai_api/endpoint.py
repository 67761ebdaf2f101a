"""What a rollout function gets to point an OpenAI client at its replica: base_url, api_key, a session id per
episode, and the session's recorded tokens at the end (a TitoSession -> Sample).

    endpoint = endpoint_of(ctx)
    sid = endpoint.session_id(ticket, index)
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    client.chat.completions.create(..., extra_headers=endpoint.headers(sid))      # every turn
    sample = endpoint.take(sid).to_sample(ticket, index, ctx.replica_id)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rlfleet.protocols import GroupTicket
from rlfleet.services.rollout.openai_api.rewarded import RewardedSessions
from rlfleet.services.rollout.openai_api.server import SESSION_HEADER
from rlfleet.services.rollout.openai_api.sessions import SessionStore
from rlfleet.services.rollout.tito import TitoSession


class NoEndpoint(RuntimeError):
    """The rollout function asked for the OpenAI endpoint on a replica that does not serve one."""


@dataclass(frozen=True)
class OpenAIEndpoint:
    base_url: str
    api_key: str             # "none" when the run has no authentication (the client insists on some string)
    store: SessionStore
    abort_sessions: Callable[[str], int] = lambda prefix: 0     # engine requests in flight of sessions `prefix*`
    rewarded: RewardedSessions = field(default_factory=RewardedSessions)   # sessions external agents rewarded

    def abort_group(self, group_id: str) -> int:
        """Abort the in-flight completions of the group's sessions (ids from session_id begin with the group id)."""
        return self.abort_sessions(f"{group_id}/")

    def session_id(self, ticket: GroupTicket, index: int) -> str:
        """A fresh id for one episode (a re-issued group gets new ones: nothing of an earlier try is reused)."""
        return f"{ticket.group_id}/{index}/{uuid.uuid4().hex[:12]}"

    def headers(self, session_id: str) -> dict[str, str]:
        return {SESSION_HEADER: session_id}

    def take(self, session_id: str) -> TitoSession:
        """The episode's recorded session, removed from the store. KeyError when it made no request."""
        session = self.store.take(session_id)
        if session is None:
            raise KeyError(f"session {session_id!r} made no request to the OpenAI endpoint (or was dropped)")
        return session


@runtime_checkable
class ServesOpenAI(Protocol):
    """A rollout context that declares its replica's OpenAI endpoint (the service's contexts): None when the replica
    serves none (rollout.openai.enabled false). A context that is not one (a test's) has no endpoint."""

    @property
    def openai(self) -> OpenAIEndpoint | None: ...


def endpoint_of(ctx: object) -> OpenAIEndpoint:
    endpoint = ctx.openai if isinstance(ctx, ServesOpenAI) else None
    if not isinstance(endpoint, OpenAIEndpoint):
        raise NoEndpoint("this rollout function needs the OpenAI endpoint: set rollout.openai.enabled: true")
    return endpoint
