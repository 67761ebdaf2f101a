"""The OpenAI-compatible HTTP server of a rollout replica (stdlib http.server: one thread per connection).

    POST /v1/chat/completions   POST /v1/completions   (stream: true answers Server-Sent Events)
    GET  /v1/models             GET  /health (no key needed: probes; 503 when the engine is not serving)
    GET  /v1/sessions/<id>      a session's TITO record (ids, loss mask, logprobs)   DELETE /v1/sessions/<id>
    POST /v1/sessions/<id>/reward   {"reward": r, "group": optional key}: the finished session becomes a training
                                sample (rewarded.py; the run's rollout_fn must be external_sessions to take it)

Authentication: `Authorization: Bearer <api key>` (one of the endpoint's keys, compared in constant time);
requests without it get 401, before any body byte is read. With `tls` (a certificate chain and key, e.g. the
replica's run-CA certificate in mtls mode) the server speaks HTTPS. Sessions: the `X-Session-Id` header names the
TITO session a request belongs to (rlfleet/services/rollout/openai_api/sessions.py), bound to the key that opened it
(another key gets 404); without it a request is answered and nothing is recorded. Bodies over `max_body_bytes` get
413; a body that is not JSON, or nests too deeply for the parser, 400. Connections: at most `max_connections` at
once, each with read deadlines (rlfleet/services/rollout/openai_api/guarded.py).

Streaming is in OpenAI's chunk format, a chunk per output token as the engine chooses it (rlfleet/services/rollout/
openai_api/streaming.py).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from rlfleet.services.rollout.openai_api.app import GenerationTimeout, OpenAIApp
from rlfleet.services.rollout.openai_api.background import (
    HANDSHAKE_SECONDS,
    MAX_CONNECTIONS,
    BackgroundHTTP,
    ThreadedHTTPServer,
)
from rlfleet.services.rollout.openai_api.guarded import GuardedHandler
from rlfleet.services.rollout.openai_api.keys import ApiKeys
from rlfleet.services.rollout.openai_api.rewarded import TooManyWaiting
from rlfleet.services.rollout.openai_api.sessions import ConflictError, SessionError, SessionNotFound
from rlfleet.services.rollout.openai_api.streaming import stream_events
from rlfleet.services.rollout.openai_api.wire import RequestError, chat_response, completion_response, error_body

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"
REPLICA_HEADER = "X-Rlfleet-Replica"
MAX_BODY_BYTES = 8 * 2**20
SESSIONS_PATH = "/v1/sessions/"
REWARD_SUFFIX = "/reward"


class _Server(ThreadedHTTPServer):
    def __init__(self, address: tuple[str, int], app: OpenAIApp, keys: ApiKeys, replica_id: str,
                 max_body_bytes: int, max_connections: int) -> None:
        super().__init__(address, _Handler, max_connections)
        self.app, self.keys, self.replica_id, self.max_body_bytes = app, keys, replica_id, max_body_bytes


class _Handler(GuardedHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True        # headers and body are two writes: no 40 ms delayed-ACK stall
    server: _Server
    owner: str | None = None              # the id of the API key the request carries (sessions.py)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # ---- plumbing ------------------------------------------------------------------------------------------------
    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(REPLICA_HEADER, self.server.replica_id)
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, events: Iterable[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header(REPLICA_HEADER, self.server.replica_id)
        self.end_headers()
        self.close_connection = True
        try:
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return                                   # the reader left; the turn was still recorded
        except GenerationTimeout as exc:
            self._event(error_body(str(exc), "timeout"))
        except Exception as exc:  # noqa: BLE001 - the status line is sent: the failure goes in the stream
            log.exception("OpenAI endpoint: stream of %s failed", self.path)
            self._event(error_body(f"{type(exc).__name__}: {exc}", "server_error"))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, body: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        self._send_json(status, error_body(message, kind, code))

    def _authorized(self) -> bool:
        """Whether the request carries one of the keys (then `self.owner` is its id); answers 401 otherwise."""
        keys: ApiKeys = self.server.keys
        self.owner = keys.owner(self.headers.get("Authorization", ""))
        if not keys.required or self.owner is not None:
            return True
        self._error(401, "missing or wrong API key (the run's key: see docs/architecture.md, OpenAI endpoint)",
                    "authentication_error", "invalid_api_key")
        return False

    def _body(self) -> dict[str, Any] | None:
        raw = self.read_body(self.server.max_body_bytes)
        if raw is None:
            return None
        try:
            body = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._error(400, f"request body is not JSON: {exc}")
            return None
        except RecursionError:
            self._error(400, "request body nests too deeply")
            return None
        if not isinstance(body, dict):
            self._error(400, "request body must be a JSON object")
            return None
        return body

    # ---- routes --------------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path == "/health":
            engine = self.server.app.engine
            ok = engine.healthy()
            self._send_json(200 if ok else 503, {"status": "ok" if ok else "engine not serving",
                                                 "weight_version": engine.weight_version})
            return
        if not self._authorized():
            return
        if self.path.startswith(SESSIONS_PATH):
            try:
                record = self.server.app.store.record(unquote(self.path.removeprefix(SESSIONS_PATH)), self.owner)
            except ConflictError as exc:
                self._error(409, str(exc), code="session_busy")
                return
            if record is None:
                self._error(404, "no such session", code="not_found")
            else:
                self._send_json(200, record)
            return
        if self.path == "/v1/models":
            name = self.server.app.settings.model_name
            self._send_json(200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                              "owned_by": "rlfleet"}]})
            return
        self._error(404, f"no route {self.path}", code="not_found")

    def do_DELETE(self) -> None:
        if not self._authorized():
            return
        if not self.path.startswith(SESSIONS_PATH):
            self._error(404, f"no route {self.path}", code="not_found")
            return
        found = self.server.app.store.discard(unquote(self.path.removeprefix(SESSIONS_PATH)), self.owner)
        self._send_json(200 if found else 404, {"deleted": found})

    def _reward(self, session_id: str) -> None:
        body = self._body()
        if body is None:
            return
        try:
            waiting = self.server.app.reward(session_id, body, self.owner)
        except RequestError as exc:
            self._error(400, str(exc), code=exc.code)
        except SessionNotFound as exc:
            self._error(404, str(exc), code="not_found")
        except ConflictError as exc:
            self._error(409, str(exc), code="session_busy")
        except TooManyWaiting as exc:
            self._error(503, str(exc), "server_error", "too_many_waiting")
        else:
            self._send_json(200, {"session_id": session_id, "accepted": True, "waiting": waiting})

    def do_POST(self) -> None:
        if not self._authorized():
            return                                   # the body is not read: the answer closes the connection
        if self.path.startswith(SESSIONS_PATH) and self.path.endswith(REWARD_SUFFIX):
            self._reward(unquote(self.path.removeprefix(SESSIONS_PATH).removesuffix(REWARD_SUFFIX)))
            return
        routes = {"/v1/chat/completions": True, "/v1/completions": False}
        if self.path not in routes:
            self._error(404, f"no route {self.path}", code="not_found")
            return
        body = self._body()
        if body is None:
            return
        chat = routes[self.path]
        app = self.server.app
        session_id = self.headers.get(SESSION_HEADER) or None
        stream = bool(body.get("stream"))
        try:
            turn = app.begin(body, session_id, chat, self.owner)
            completion = None if stream else app.finish(turn)
        except RequestError as exc:
            self._error(400, str(exc), code=exc.code)
            return
        except SessionNotFound as exc:
            self._error(404, str(exc), code="not_found")
            return
        except RecursionError:
            self._error(400, "request body nests too deeply")
            return
        except (SessionError, ValueError) as exc:
            self._error(400, str(exc))
            return
        except ConflictError as exc:
            self._error(409, str(exc), code="session_busy")
            return
        except GenerationTimeout as exc:
            self._error(504, str(exc), "timeout")
            return
        except Exception as exc:  # noqa: BLE001 - an engine failure answers this request only
            log.exception("OpenAI endpoint: %s failed", self.path)
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
            return
        model = str(body.get("model") or app.settings.model_name)
        logprobs = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
        if completion is None:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_events(stream_events(app, turn, model, logprobs, usage))
            return
        make_one = chat_response if chat else completion_response
        self._send_json(200, make_one(completion, model, app.tokenizer, logprobs))


class OpenAIServer(BackgroundHTTP):
    """Serve `app` on host:port (port 0: a free one) in a background thread; `base_url` is what clients pass as the
    openai client's base_url."""

    def __init__(self, app: OpenAIApp, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | Sequence[str] | None = None, replica_id: str = "",
                 tls: tuple[Path, Path] | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 handshake_seconds: float = HANDSHAKE_SECONDS, max_connections: int = MAX_CONNECTIONS) -> None:
        """api_key: the key clients send, or several (one per tenant: each owns the sessions it opens); None: no
        authentication. handshake_seconds: with tls, how long a client may take over its TLS handshake before it
        is dropped. max_connections: served at once; more are refused at accept."""
        self.app = app
        http = _Server((host, port), app, ApiKeys(api_key), replica_id, max_body_bytes, max_connections)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            http.serve_tls(context, handshake_seconds)
        super().__init__(http, host, "https" if tls is not None else "http", "openai-http")
