"""What the OpenAI endpoint does with a request, apart from HTTP: find the session, generate on the engine, record
the turn. A request without a session id is answered the same way from a throwaway session (nothing is kept)."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import Abortable, Engine, EngineError, Streaming
from rlfleet.services.rollout.openai_api.rewarded import MAX_GROUP_KEY, RewardedSession, RewardedSessions
from rlfleet.services.rollout.openai_api.sessions import SessionStore
from rlfleet.services.rollout.openai_api.wire import Completion, RequestError, messages_of, prompt_of, sampling_of
from rlfleet.services.rollout.tito import TitoError, TitoSession


class GenerationTimeout(RuntimeError):
    """The engine did not finish within request_timeout (HTTP 504)."""


@dataclass(frozen=True)
class AppSettings:
    model_name: str = "rlfleet"
    max_context: int | None = None          # the model's positions (max_position_embeddings); None: unchecked
    request_timeout: float = 600.0


@dataclass
class Turn:
    """One request's engine turn between begin and finish. tokens: (id, logprob) as the engine chooses them (a
    streaming engine, stream requests only; otherwise empty)."""

    session: TitoSession
    session_id: str | None
    prompt_ids: list[int]
    future: Future[Generation]
    tokens: queue.SimpleQueue[tuple[int, float]]
    chat: bool
    deadline: float              # time.monotonic() after which finish aborts the generation


def reward_of(body: Mapping[str, Any]) -> tuple[float, str | None]:
    """(reward, group key) of a reward body {"reward": <finite number>, "group": <optional string>}."""
    value = body.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"'reward' must be a finite number, got {value!r:.40}")
    group = body.get("group")
    if group is not None and (not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_KEY):
        raise RequestError(f"'group' must be a string of 1 to {MAX_GROUP_KEY} characters")
    unknown = set(body) - {"reward", "group"}
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(sorted(unknown))}: a reward body holds 'reward' and "
                           "optionally 'group'")
    return float(value), group


class OpenAIApp:
    """Thread-safe: every HTTP request thread calls chat / complete."""

    def __init__(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, store: SessionStore,
                 settings: AppSettings = AppSettings()) -> None:
        self.engine, self.tokenizer, self.sampling, self.store = engine, tokenizer, sampling, store
        self.settings = settings
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[Generation]] = {}     # session id -> its engine request now
        self.rewarded = RewardedSessions()                      # finished external sessions, waiting for a group

    def reward(self, session_id: str, body: Mapping[str, Any], owner: str | None) -> int:
        """`POST /v1/sessions/<id>/reward`: the session (opened under `owner`) leaves the store with its reward and
        waits for a group (rewarded.py). Returns how many wait now. RequestError for a bad body or a session with no
        completion; SessionNotFound (unknown, or another key's), ConflictError (a completion in flight),
        TooManyWaiting (rewarded.py)."""
        reward, group = reward_of(body)
        session = self.store.take_owned(session_id, owner)
        if not session.model_turns:
            raise RequestError(f"session {session_id!r} has no completion to train on")
        return self.rewarded.put(RewardedSession(session_id, session, reward, group))

    def abort_sessions(self, prefix: str) -> int:
        """Abort the engine requests in flight of the sessions whose id starts with `prefix` (a group the buffer
        cancelled: session ids begin with its group id); they answer finish_reason 'abort'. Returns how many."""
        with self._lock:
            pending = [f for sid, f in self._in_flight.items() if sid.startswith(prefix) and not f.done()]
        return int(self.engine.abort(pending)) if pending and isinstance(self.engine, Abortable) else 0

    def chat(self, body: Mapping[str, Any], session_id: str | None) -> Completion:
        return self.finish(self.begin(body, session_id, chat=True))

    def complete(self, body: Mapping[str, Any], session_id: str | None) -> Completion:
        return self.finish(self.begin(body, session_id, chat=False))

    def begin(self, body: Mapping[str, Any], session_id: str | None, chat: bool, owner: str | None = None) -> Turn:
        """Position the session (or a throwaway one) for the next engine turn and submit it. The caller must call
        finish(turn) (it records the turn and frees the session), also when it stops reading. owner: the API key
        the request came with (its id); a session opened under another is SessionNotFound."""
        if chat:
            messages = messages_of(body)
            if session_id is None:
                try:
                    session = TitoSession(self.tokenizer, messages)
                except TitoError as exc:
                    raise RequestError(str(exc)) from None
            else:
                session = self.store.begin_chat(session_id, messages, owner)
        else:
            prompt = prompt_of(body)
            session = TitoSession.from_prompt(self.tokenizer, prompt) if session_id is None else \
                self.store.begin_completion(session_id, prompt, owner)
        try:
            return self._submit(session, body, chat, session_id)
        except Exception:
            if session_id is not None:
                self.store.end(session_id)
            raise

    def _submit(self, session: TitoSession, body: Mapping[str, Any], chat: bool, session_id: str | None) -> Turn:
        prompt_ids = session.input_ids
        room = None if self.settings.max_context is None else self.settings.max_context - len(prompt_ids)
        sampling = sampling_of(body, self.sampling, self.tokenizer, room)
        tokens: queue.SimpleQueue[tuple[int, float]] = queue.SimpleQueue()
        engine = self.engine
        try:
            future = (engine.submit_streaming(prompt_ids, sampling, lambda t, lp: tokens.put((t, lp)))
                      if body.get("stream") and isinstance(engine, Streaming) else engine.submit(prompt_ids, sampling))
        except EngineError as exc:
            raise RequestError(str(exc)) from None
        if session_id is not None:
            with self._lock:
                self._in_flight[session_id] = future
        return Turn(session, session_id, prompt_ids, future, tokens, chat,
                    time.monotonic() + self.settings.request_timeout)

    def finish(self, turn: Turn) -> Completion:
        """Wait for the turn's generation (until its deadline), record it in the session and free the session."""
        try:
            try:
                gen = turn.future.result(timeout=max(turn.deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                if isinstance(self.engine, Abortable):
                    self.engine.abort([turn.future])
                raise GenerationTimeout(f"generation did not finish in {self.settings.request_timeout:.0f}s") \
                    from None
            content = turn.session.add_generation(gen)
        finally:
            if turn.session_id is not None:
                with self._lock:
                    self._in_flight.pop(turn.session_id, None)
                self.store.end(turn.session_id)
        text = content if turn.chat else self.tokenizer.decode(list(gen.output_ids), skip_special_tokens=False,
                                                               clean_up_tokenization_spaces=False)
        return Completion(generation=gen, text=str(text), prompt_ids=turn.prompt_ids)
