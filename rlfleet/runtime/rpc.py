"""gRPC glue shared by every service: servers with health checking, auth and size limits; authenticated channels."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.security.authz import Authorizer, Limits
from rlfleet.security.identity import Credential, Identity

MAX_MESSAGE_BYTES = 256 * 1024 * 1024       # weight chunks and large batches; every server and channel sets it
DEFAULT_DEADLINE = 30.0                      # seconds, for unary control calls
_AUTH_KEY = "authorization"
_UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)   # kubelet gRPC probes send no metadata
SERVER_RECEIVE_BYTES = 32 * 1024 * 1024      # what a server reads per request: no request carries weights

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
# HTTP/2 keepalive: a peer that stops answering (SIGSTOP, a partition, a dead node without a FIN) fails the calls in
# flight after KEEPALIVE_S + KEEPALIVE_TIMEOUT_S instead of at their deadline (minutes for long waits and streams).
KEEPALIVE_S = 20.0
KEEPALIVE_TIMEOUT_S = 10.0


def keepalive_options(every_s: float = KEEPALIVE_S, timeout_s: float = KEEPALIVE_TIMEOUT_S) -> list[tuple[str, int]]:
    """Channel options: ping every every_s, even with no call open, and drop the connection when a ping (keepalive
    or the BDP probe's, which otherwise holds keepalive off while it waits) is unanswered for timeout_s."""
    timeout_ms = int(timeout_s * 1000)
    return [("grpc.keepalive_time_ms", int(every_s * 1000)), ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.ping_timeout_ms", timeout_ms), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]


def server_keepalive_options(every_s: float = KEEPALIVE_S, timeout_s: float = KEEPALIVE_TIMEOUT_S
                             ) -> list[tuple[str, int]]:
    """Servers ping their clients the same way (a frozen subscriber's stream ends), and accept clients' pings at
    any rate down to 1 s (no GOAWAY strikes)."""
    return [*keepalive_options(every_s, timeout_s), ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0)]


def read_token(token_file: str | None) -> str | None:  # kept for callers; see rlfleet.security.credentials
    """The shared run token, or None in explicit no-auth mode. RLFLEET_TOKEN overrides the file."""
    if os.environ.get("RLFLEET_TOKEN"):
        return os.environ["RLFLEET_TOKEN"]
    if token_file is None:
        return None
    return Path(token_file).read_text().strip()


class _TokenAuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong run token")

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method or ""
        if method.startswith(_UNAUTHENTICATED_PREFIXES):
            return continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get(_AUTH_KEY, "")
        if hmac.compare_digest(str(got).encode(), self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._deny_for(handler)

    def _deny_for(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong run token")

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return self._deny_unary


def _server_credentials(identity: Identity) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(identity.key_pem, identity.cert_pem)], root_certificates=identity.ca_pem,
                                       require_client_auth=True)


class Server:
    """A gRPC server with the health service registered and serving once started.

    `token` is the credential: an Identity (mTLS, roles per method), a str (shared run token) or None (no auth).
    Requests over `max_receive_bytes` are refused before they are read; long polls and each caller get a capped
    share of the `max_workers` threads (rlfleet.security.authz).
    """

    def __init__(self, bind: str, token: Credential, max_workers: int = 16,
                 max_receive_bytes: int = SERVER_RECEIVE_BYTES, keepalive_s: float = KEEPALIVE_S,
                 keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S) -> None:
        limits = Limits(per_caller=max(2, max_workers // 4), long_polls=max(1, max_workers - max(4, max_workers // 4)))
        mtls = isinstance(token, Identity)
        interceptors: list[grpc.ServerInterceptor] = [] if mtls or not token else [_TokenAuthInterceptor(str(token))]
        interceptors.append(Authorizer(limits, authenticate=mtls))
        options = list({**dict(_OPTIONS), "grpc.max_receive_message_length": max_receive_bytes}.items())
        options += server_keepalive_options(keepalive_s, keepalive_timeout_s)
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=interceptors,
                                options=options)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        self.port = (self.grpc.add_secure_port(bind, _server_credentials(token)) if isinstance(token, Identity)
                     else self.grpc.add_insecure_port(bind))
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {bind}")
        self._names: list[str] = []

    def add(self, register: Callable[[Any, grpc.Server], None], servicer: Any, name: str) -> None:
        register(servicer, self.grpc)
        self._names.append(name)

    def start(self) -> None:
        self.grpc.start()
        self.set_serving(True)

    def set_serving(self, serving: bool) -> None:
        """What grpc.health.v1 answers for the server and each of its services (probes, the launcher's wait)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._names]:
            self.health.set(name, status)

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.grpc.stop(grace).wait()

    def wait(self) -> None:
        self.grpc.wait_for_termination()



class _ClientAuthInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._md = (_AUTH_KEY, f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        md = list(details.metadata or []) + [self._md]
        return details._replace(metadata=md) if hasattr(details, "_replace") else _CallDetails(details, md)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


def channel(address: str, token: Credential, keepalive_s: float = KEEPALIVE_S,
            keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S) -> grpc.Channel:
    """A channel with HTTP/2 keepalive presenting `token`: an Identity (mTLS, the server verified against the run
    CA), a run token attached to every call (insecure transport), or nothing."""
    options = [*_OPTIONS, *keepalive_options(keepalive_s, keepalive_timeout_s)]
    if isinstance(token, Identity):
        creds = grpc.ssl_channel_credentials(token.ca_pem, token.key_pem, token.cert_pem)
        return grpc.secure_channel(address, creds, options=options)
    ch = grpc.insecure_channel(address, options=options)
    if token:
        ch = grpc.intercept_channel(ch, _ClientAuthInterceptor(token))
    return ch


def wait_healthy(address: str, timeout: float = 60.0, service: str = "", token: Credential = None) -> None:
    """Block until the server at address reports SERVING, or raise TimeoutError. An mTLS server needs an Identity."""
    import time

    deadline = time.monotonic() + timeout
    with channel(address, token) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{address} not healthy after {timeout:.0f}s ({last})")
