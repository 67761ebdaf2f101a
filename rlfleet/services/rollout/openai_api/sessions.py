"""TITO sessions of the OpenAI endpoint: session id -> the conversation's exact token sequence.

An agent sends the whole conversation with every request (as the OpenAI API wants). The first request of a session
opens a TitoSession; each later one must extend what the session holds: the held messages (the assistant's exactly as
the endpoint returned them), then new environment messages (tool results, user turns), which are appended as the chat
template renders them (loss mask 0). The engine continues from the held ids, and its output ids are appended
unchanged (loss mask 1, with their logprobs and weight versions). Raw completions work the same on text (the prompt
must start with the held text) or on token ids. So the sample a session becomes has the ids the engine saw and
produced, never a re-tokenisation of the conversation's text.

One request of a session runs at a time (a second one while the first is in flight is refused: ConflictError).
At most `max_sessions` are held; the least recently used beyond that are dropped (logged).

A session belongs to the API key that opened it (`owner`: which of the endpoint's keys; None without keys): a request
under another key continuing, reading or deleting it is told there is no such session (SessionNotFound, HTTP 404),
so holders of different keys (tenants) neither see nor touch each other's sessions. The rollout function's `take`
(in process) is not asked for a key.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet.services.rollout.tito import TitoError, TitoSession

log = logging.getLogger(__name__)


class SessionError(ValueError):
    """A request that does not extend its session's conversation (HTTP 400)."""


class ConflictError(RuntimeError):
    """A request of a session while another of the same session is in flight (HTTP 409)."""


class SessionNotFound(LookupError):
    """A session opened under another API key (HTTP 404: to this key it does not exist)."""


@dataclass
class _Entry:
    session: TitoSession | None = None
    kind: str = ""                     # "chat" | "completion"
    busy: bool = False
    owner: str | None = None           # the API key (its id) that opened it


ANY_OWNER = object()       # record/discard in process: whoever opened the session


def _owned(entry: _Entry, owner: object) -> bool:
    return owner is ANY_OWNER or entry.owner == owner


def _same(held: Mapping[str, str], sent: Mapping[str, str]) -> bool:
    return held.get("role") == sent.get("role") and held.get("content", "") == sent.get("content", "")


class SessionStore:
    """Thread-safe. `begin_*` returns the session positioned for the next engine turn (mark it busy); `end` frees
    it; `take` removes a session and hands it over (the rollout function turns it into a Sample)."""

    def __init__(self, tokenizer: Any, max_sessions: int = 4096) -> None:
        self._tokenizer = tokenizer
        self._max = max_sessions
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _claim(self, session_id: str, owner: str | None) -> _Entry:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None and entry.owner != owner:
                raise SessionNotFound(f"no session {session_id!r} under this API key")
            if entry is None:
                entry = self._entries[session_id] = _Entry(owner=owner)
                while len(self._entries) > self._max:
                    dropped, _ = self._entries.popitem(last=False)
                    log.warning("OpenAI endpoint: more than %d sessions held; dropped the oldest, %s", self._max,
                                dropped)
            self._entries.move_to_end(session_id)
            if entry.busy:
                raise ConflictError(f"session {session_id!r} has a completion in flight")
            entry.busy = True
            return entry

    def _release_on_error(self, entry: _Entry) -> None:
        entry.busy = False

    def begin_chat(self, session_id: str, messages: Sequence[Mapping[str, str]],
                   owner: str | None = None) -> TitoSession:
        entry = self._claim(session_id, owner)
        try:
            if entry.session is None:
                entry.session, entry.kind = TitoSession(self._tokenizer, messages), "chat"
                return entry.session
            if entry.kind != "chat":
                raise SessionError(f"session {session_id!r} holds raw completions, not a chat")
            held = entry.session.messages
            bad = next((i for i, (h, s) in enumerate(zip(held, messages, strict=False)) if not _same(h, s)), None)
            if bad is not None or len(messages) < len(held):
                at = bad if bad is not None else len(messages)
                raise SessionError(f"messages do not extend session {session_id!r}: message {at} differs from the "
                                   "one held (send the conversation so far, the assistant's turns exactly as "
                                   "returned, then the new messages)")
            new = list(messages[len(held):])
            if new:
                try:
                    entry.session.add_messages(new)
                except TitoError as exc:
                    raise SessionError(str(exc)) from None
            return entry.session
        except Exception:
            self._release_on_error(entry)
            raise

    def begin_completion(self, session_id: str, prompt: str | Sequence[int],
                         owner: str | None = None) -> TitoSession:
        entry = self._claim(session_id, owner)
        try:
            if entry.session is None:
                entry.session, entry.kind = TitoSession.from_prompt(self._tokenizer, prompt), "completion"
                return entry.session
            if entry.kind != "completion":
                raise SessionError(f"session {session_id!r} holds a chat, not raw completions")
            try:
                if isinstance(prompt, str):
                    entry.session.extend_text(prompt)
                else:
                    entry.session.extend_ids(prompt)
            except TitoError as exc:
                raise SessionError(f"session {session_id!r}: {exc}") from None
            return entry.session
        except Exception:
            self._release_on_error(entry)
            raise

    def end(self, session_id: str) -> None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                entry.busy = False

    def take(self, session_id: str) -> TitoSession | None:
        """Remove the session and return it (None when unknown: never opened, or dropped)."""
        with self._lock:
            entry = self._entries.pop(session_id, None)
        if entry is None:
            return None
        if entry.busy:
            log.warning("session %s taken with a completion in flight", session_id)
        return entry.session

    def take_owned(self, session_id: str, owner: object) -> TitoSession:
        """Remove and return the session opened under `owner` (an external agent rewarding its episode).
        SessionNotFound when unknown, another key's, or never answered; ConflictError while a completion of it is in
        flight (the session stays)."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry.session is None or not _owned(entry, owner):
                raise SessionNotFound(f"no session {session_id!r} under this API key")
            if entry.busy:
                raise ConflictError(f"session {session_id!r} has a completion in flight")
            del self._entries[session_id]
            return entry.session

    def record(self, session_id: str, owner: object = ANY_OWNER) -> dict[str, Any] | None:
        """The session's tokens so far as plain data (an external agent's view of what it will be trained on);
        None when unknown or opened under another key than `owner` (ANY_OWNER: in process, unchecked).
        ConflictError while a completion of it is in flight."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry.session is None or not _owned(entry, owner):
                return None
            if entry.busy:
                raise ConflictError(f"session {session_id!r} has a completion in flight")
            s = entry.session
            return {"session_id": session_id, "prompt_ids": list(s.prompt_ids), "response_ids": list(s.response_ids),
                    "loss_mask": list(s.loss_mask), "logprobs": list(s.logprobs),
                    "token_versions": list(s.token_versions), "turns": s.model_turns,
                    "finish_reason": s.finish_reason}

    def discard(self, session_id: str, owner: object = ANY_OWNER) -> bool:
        """Remove the session opened under `owner`; False when unknown or another key's."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or not _owned(entry, owner):
                return False
            del self._entries[session_id]
        if entry.busy:
            log.warning("session %s deleted with a completion in flight", session_id)
        return True
