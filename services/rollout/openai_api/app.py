"""What the OpenAI endpoint does with a request, apart from HTTP: find the session, generate on the engine, record
the turn. A request without a session id is answered the same way from a throwaway session (nothing is kept)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from rlfleet.protocols import Generation, SamplingParams
from services.rollout.engines.base import Engine, EngineError
from services.rollout.openai_api.sessions import SessionStore
from services.rollout.openai_api.wire import Completion, RequestError, messages_of, prompt_of, sampling_of
from services.rollout.tito import TitoError, TitoSession


class GenerationTimeout(RuntimeError):
    """The engine did not finish within request_timeout (HTTP 504)."""


@dataclass(frozen=True)
class AppSettings:
    model_name: str = "rlfleet"
    max_context: int | None = None          # the model's positions (max_position_embeddings); None: unchecked
    request_timeout: float = 600.0


class OpenAIApp:
    """Thread-safe: every HTTP request thread calls chat / complete."""

    def __init__(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, store: SessionStore,
                 settings: AppSettings = AppSettings()) -> None:
        self.engine, self.tokenizer, self.sampling, self.store = engine, tokenizer, sampling, store
        self.settings = settings
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[Generation]] = {}     # session id -> its engine request now

    def abort_sessions(self, prefix: str) -> int:
        """Abort the engine requests in flight of the sessions whose id starts with `prefix` (a group the buffer
        cancelled: session ids begin with its group id); they answer finish_reason 'abort'. Returns how many."""
        with self._lock:
            pending = [f for sid, f in self._in_flight.items() if sid.startswith(prefix) and not f.done()]
        abort = getattr(self.engine, "abort", None)
        return int(abort(pending)) if pending and abort is not None else 0

    def chat(self, body: Mapping[str, Any], session_id: str | None) -> Completion:
        messages = messages_of(body)
        if session_id is None:
            try:
                return self._turn(TitoSession(self.tokenizer, messages), body, chat=True)
            except TitoError as exc:
                raise RequestError(str(exc)) from None
        session = self.store.begin_chat(session_id, messages)
        try:
            return self._turn(session, body, chat=True, session_id=session_id)
        finally:
            self.store.end(session_id)

    def complete(self, body: Mapping[str, Any], session_id: str | None) -> Completion:
        prompt = prompt_of(body)
        if session_id is None:
            return self._turn(TitoSession.from_prompt(self.tokenizer, prompt), body, chat=False)
        session = self.store.begin_completion(session_id, prompt)
        try:
            return self._turn(session, body, chat=False, session_id=session_id)
        finally:
            self.store.end(session_id)

    def _turn(self, session: TitoSession, body: Mapping[str, Any], chat: bool, session_id: str | None = None
              ) -> Completion:
        prompt_ids = session.input_ids
        room = None if self.settings.max_context is None else self.settings.max_context - len(prompt_ids)
        sampling = sampling_of(body, self.sampling, self.tokenizer, room)
        try:
            future = self.engine.submit(prompt_ids, sampling)
        except EngineError as exc:
            raise RequestError(str(exc)) from None
        if session_id is not None:
            with self._lock:
                self._in_flight[session_id] = future
        try:
            gen = future.result(timeout=self.settings.request_timeout)
        except FutureTimeout:
            abort = getattr(self.engine, "abort", None)
            if abort is not None:
                abort([future])
            raise GenerationTimeout(f"generation did not finish in {self.settings.request_timeout:.0f}s") from None
        finally:
            if session_id is not None:
                with self._lock:
                    self._in_flight.pop(session_id, None)
        content = session.add_generation(gen)
        text = content if chat else self.tokenizer.decode(list(gen.output_ids), skip_special_tokens=False,
                                                          clean_up_tokenization_spaces=False)
        return Completion(generation=gen, text=str(text), prompt_ids=prompt_ids)
