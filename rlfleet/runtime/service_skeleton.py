"""One skeleton for every gRPC service: `python -m rlfleet.services.<name>` is `run_service(SPEC)`.

A service describes its parts in a ServiceSpec; its `start` builds and starts them (store, servicers on a
rlfleet.runtime.rpc.Server, metrics registry and port, background threads) and returns the running Service. run_service
then does, for every service alike:

    parse args (--config, --listen, --metrics-port, the service's own) -> credential        bad: exit 2, one line
    spec.start(args): bind, Server, servicers, metrics, background loop                   StartError: its code
    the heap so far frozen out of full garbage collections while it serves (rlfleet/runtime/gc_heap.py)
    SIGTERM / SIGINT (those the spec names) -> Service.signalled (one that came during start: once it returned)
    Service.serve(): serve / run the loop until done or signalled -> Outcome
    Service.close(): the ordered stop, always, also after an error
    exit code (rlfleet/runtime/exit_codes.py); a failure's reason is the last line on stderr, `<name>: <reason>`

An uncaught error is logged with its traceback and exits DEVICE_FAULT when it names a faulty device, else FAILED.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlfleet.config import ConfigError
from rlfleet.runtime.exit_codes import DEVICE_FAULT, FAILED, OK, USAGE, is_device_fault
from rlfleet.runtime.gc_heap import frozen_heap
from rlfleet.runtime.service_main import ServiceArgs, listen_address, parse_service_args

ExtraArg = tuple[tuple[str, ...], dict[str, Any]]      # argparse add_argument(*flags, **options)


@dataclass(frozen=True)
class Outcome:
    """How serve() ended: the exit code and, for a failure, the reason printed last on stderr (after close)."""

    code: int = OK
    reason: str = ""


class StartError(Exception):
    """start() cannot bring the service up: the reason (one line) and the exit code (default USAGE: bad input)."""

    def __init__(self, reason: str, code: int = USAGE) -> None:
        super().__init__(reason)
        self.code = code


class Service(Protocol):
    """A started service. serve() runs on the main thread; signalled() is called from a signal handler (main
    thread, between bytecodes: it must only set flags); close() runs once after serve() returned or raised."""

    def serve(self) -> Outcome: ...

    def signalled(self, signum: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServiceSpec:
    """What differs between services; everything else is run_service."""

    name: str                                            # python -m rlfleet.services.<name>; the stderr prefix
    start: Callable[[ServiceArgs], Service]              # build and start the parts; raises StartError
    extra_args: tuple[ExtraArg, ...] = ()
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)   # delivered to Service.signalled
    exit_at_once: frozenset[int] = frozenset()           # codes that end with os._exit: no joining stuck threads
    label: Callable[[ServiceArgs], str] | None = None    # the stderr prefix when it is more than the name
    before_args: Callable[[list[str] | None], int | None] | None = None   # runs first; an int ends the process
    warm: tuple[str, ...] = ()      # what an interpreter started early imports before it is told to start
                                    # (rlfleet/local/warm_interpreter.py): the service's heavy imports


def bind_address(endpoint_field: str, endpoint: str, listen: str | None) -> str:
    """The address to serve on (rlfleet.runtime.service_main.listen_address); a bad one is a StartError naming
    the field."""
    try:
        return listen_address(endpoint, listen)
    except ConfigError as exc:
        raise StartError(f"{exc} (set {endpoint_field} or --listen)") from None


def one_line(text: str) -> str:
    return " ".join(text.split())


def run_service(spec: ServiceSpec, argv: list[str] | None = None) -> int:
    """Run the service `spec` describes to its end; returns the exit code (see the module's docstring)."""
    if spec.before_args is not None:
        early = spec.before_args(argv)
        if early is not None:
            return early
    args = parse_service_args(spec.name, argv, list(spec.extra_args))
    label = spec.label(args) if spec.label is not None else spec.name
    log = logging.getLogger(f"rlfleet.services.{spec.name}")
    started: list[Service] = []
    early_signals: list[int] = []          # a stop asked for while the service starts: delivered once it runs

    def on_signal(number: int, frame: object) -> None:
        if started:
            started[0].signalled(number)
        else:
            early_signals.append(number)

    if threading.current_thread() is threading.main_thread():
        for signum in spec.signals:
            signal.signal(signum, on_signal)
    try:
        service = spec.start(args)
    except StartError as exc:
        print(f"{label}: {one_line(str(exc))}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # noqa: BLE001 - every failure ends as one clear last line
        return _failed(log, label, exc)
    started.append(service)
    for number in early_signals:
        service.signalled(number)
    failure: Exception | None = None
    outcome = Outcome(FAILED)
    with frozen_heap():                    # what it built, out of full collections while it serves (gc_heap.py)
        try:
            outcome = service.serve()
        except Exception as exc:  # noqa: BLE001 - reported after the ordered stop
            failure = exc
        finally:
            service.close()
    if failure is not None:
        return _failed(log, label, failure)
    if outcome.reason:
        print(f"{label}: {one_line(outcome.reason)}", file=sys.stderr)
    if outcome.code in spec.exit_at_once:
        logging.shutdown()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(outcome.code)
    return outcome.code


def _failed(log: logging.Logger, label: str, exc: Exception) -> int:
    log.error("%s failed", label, exc_info=exc)
    print(f"{label}: {type(exc).__name__}: {one_line(str(exc))}", file=sys.stderr)
    return DEVICE_FAULT if is_device_fault(exc) else FAILED
