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

MAX_MESSAGE_BYTES = 256 * 1024 * 1024       # weight chunks and large batches; every server and channel sets it
DEFAULT_DEADLINE = 30.0                      # seconds, for unary control calls
_AUTH_KEY = "authorization"
_UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)   # kubelet gRPC probes send no metadata

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def read_token(token_file: str | None) -> str | None:
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


class Server:
    """A gRPC server with the health service registered and serving once started."""

    def __init__(self, bind: str, token: str | None, max_workers: int = 16) -> None:
        interceptors = [_TokenAuthInterceptor(token)] if token else []
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=interceptors,
                                options=_OPTIONS)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        self.port = self.grpc.add_insecure_port(bind)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {bind}")
        self._names: list[str] = []

    def add(self, register: Callable[[Any, grpc.Server], None], servicer: Any, name: str) -> None:
        register(servicer, self.grpc)
        self._names.append(name)

    def start(self) -> None:
        self.grpc.start()
        for name in ["", *self._names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

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


def channel(address: str, token: str | None) -> grpc.Channel:
    """An insecure loopback/cluster channel that attaches the run token to every call."""
    ch = grpc.insecure_channel(address, options=_OPTIONS)
    if token:
        ch = grpc.intercept_channel(ch, _ClientAuthInterceptor(token))
    return ch


def wait_healthy(address: str, timeout: float = 60.0, service: str = "") -> None:
    """Block until the server at address reports SERVING, or raise TimeoutError."""
    import time

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as ch:
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
