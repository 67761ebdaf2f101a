"""The server interceptor of mTLS mode: who is calling (from the peer certificate), may they call this method with
this request (rlfleet.security.roles), and is there room for the call (per-caller and long-poll caps).

Refusals: no verified identity -> UNAUTHENTICATED; a role the table does not list for the method, or a request that
names another component -> PERMISSION_DENIED; over the caller's concurrent-call cap, or every long-poll slot taken
-> RESOURCE_EXHAUSTED (at once, so a flood of waits never holds the threads the trainer's calls need).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from rlfleet.security.identity import Peer, peer_of
from rlfleet.security.roles import ALLOWED, BOUND, LONG_POLLS


@dataclass(frozen=True)
class Limits:
    per_caller: int = 16          # concurrent calls one identity may have in flight on one server
    long_polls: int = 48          # concurrent calls of roles.LONG_POLLS on one server (keep below its threads)


class _Slots:
    """Counters of calls in flight: per caller, and of long polls. Non-blocking: a full slot refuses."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._per: dict[str, int] = {}
        self._polls = 0

    def take(self, caller: str, long_poll: bool) -> str | None:
        with self._lock:
            if self._per.get(caller, 0) >= self._limits.per_caller:
                return f"{caller} already has {self._limits.per_caller} calls in flight on this server"
            if long_poll and self._polls >= self._limits.long_polls:
                return f"all {self._limits.long_polls} long-poll slots of this server are taken; retry"
            self._per[caller] = self._per.get(caller, 0) + 1
            self._polls += long_poll
        return None

    def give(self, caller: str, long_poll: bool) -> None:
        with self._lock:
            left = self._per[caller] - 1
            if left:
                self._per[caller] = left
            else:
                del self._per[caller]
            self._polls -= long_poll


class Authorizer(grpc.ServerInterceptor):
    """Wraps every method handler with the identity, role, binding and capacity checks (None: skip auth)."""

    def __init__(self, limits: Limits = Limits(), authenticate: bool = True,
                 allowed: dict[str, frozenset[str]] = ALLOWED,
                 bound: dict[str, Callable[[Any, str, str], str | None]] = BOUND) -> None:
        self._slots = _Slots(limits)
        self._authenticate = authenticate
        self._allowed = allowed
        self._bound = bound

    def _admit(self, method: str, request: Any, context: grpc.ServicerContext) -> Peer:
        if not self._authenticate:
            return Peer("none", context.peer().rpartition(":")[0] or "anonymous")
        peer = peer_of(context)
        if peer is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "no verified rlfleet identity on this connection")
        assert peer is not None
        if peer.role not in self._allowed.get(method, frozenset()):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"role '{peer.role}' ({peer.name}) may not call {method}")
        bind = self._bound.get(method)
        if bind is not None and request is not None:
            problem = bind(request, peer.role, peer.name)
            if problem:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {problem}")
        return peer

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method or ""
        long_poll = method in LONG_POLLS
        admit, slots = self._admit, self._slots

        def enter(request: Any, context: grpc.ServicerContext) -> str:
            caller = admit(method, request, context).name
            problem = slots.take(caller, long_poll)
            if problem:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, problem)
            return caller

        def streamed(inner: Iterator[Any], caller: str) -> Iterator[Any]:
            try:
                yield from inner
            finally:
                slots.give(caller, long_poll)

        def unary(behavior: Callable[[Any, grpc.ServicerContext], Any], request_streaming: bool) -> Callable:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                caller = enter(None if request_streaming else request, context)
                try:
                    return behavior(request, context)
                finally:
                    slots.give(caller, long_poll)
            return run

        def stream(behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]], request_streaming: bool
                   ) -> Callable:
            def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                caller = enter(None if request_streaming else request, context)
                try:
                    inner = behavior(request, context)
                except BaseException:
                    slots.give(caller, long_poll)
                    raise
                return streamed(iter(inner), caller)
            return run

        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary, False), **kw)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary, True), **kw)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(stream(handler.unary_stream, False), **kw)
        return grpc.stream_stream_rpc_method_handler(stream(handler.stream_stream, True), **kw)
