"""A service's interpreter started before its run is ready: python -m rlfleet.local.warm_interpreter MODULE [HINT ...]

`rlfleet run` starts the heavy services' interpreters (trainer ranks, rollout replicas) first, so their imports
(torch and transformers: 3-4 s a process on this machine) run while the launcher checks the config, builds the
run folder and starts the light services (rlfleet/local/warm_interpreters.py is the launcher's side). This process
imports MODULE's server (its ServiceSpec) and the spec's `warm` modules, then HINT modules where they import (the
model's transformers module), and answers the launcher line by line, one JSON object a line on stdin:

- {"check": MODULE, "input": TEXT}: `MODULE.check(TEXT)` (the trainer's algorithm check, so the preflight needs no
  interpreter of its own); the reply is one line {"error": REASON} on stdout, "" when it passed (what an import
  prints to stdout goes to stderr instead, so it is never taken for a reply);
- {"go": {"argv": [...], "env": {...}, "log": PATH}}: become the service: the environment replaced, stdout and
  stderr appended to the log, then exactly what `python -m MODULE ARGV...` runs (run_service of its spec);
- end of input (the preflight failed, the launcher stopped, or it started this service cold): exit 0, having
  started nothing.

It imports no service code before its arguments are read, and a module that fails to import here fails again,
with its traceback in the service's log, when the service imports it after "go".
"""

from __future__ import annotations

import importlib
import json
import os
import select
import sys
from collections.abc import Sequence
from typing import IO, Any


def _replies() -> IO[str]:
    """The launcher's pipe for replies, taken off fd 1: anything an import prints to stdout goes to stderr (the
    early log) and cannot be mistaken for a reply."""
    sys.stdout.flush()
    pipe = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return pipe


def _reply(replies: IO[str], message: dict[str, Any]) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _become(go: dict[str, Any]) -> list[str]:
    """Redirect stdout / stderr to the service's log, take its environment; returns its argv."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(go["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.dup2(null, 0)                     # as a cold-started service: nothing to read on stdin
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in go["env"].items()})
    return [str(a) for a in go["argv"]]


class _Lines:
    """Lines from stdin (fd 0), read without Python's buffering so `ready` can ask select whether one waits."""

    def __init__(self) -> None:
        self._buf = b""
        self.closed = False

    def ready(self) -> bool:
        """A line (or the end of input) can be read without waiting."""
        return b"\n" in self._buf or (not self.closed and bool(select.select([0], [], [], 0)[0]))

    def next(self) -> str | None:
        """The next line; None at end of input."""
        while b"\n" not in self._buf:
            if self.closed:
                return None
            chunk = os.read(0, 65536)
            if not chunk:
                self.closed = True
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()


def _answer(replies: IO[str], message: dict[str, Any]) -> None:
    _reply(replies, {"error": importlib.import_module(message["check"]).check(message["input"])})


def main(argv: Sequence[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m rlfleet.local.warm_interpreter MODULE [HINT ...]\n")
        return 2
    module, hints = argv[0], argv[1:]
    replies = _replies()
    from rlfleet.runtime.gc_heap import imported_heap_frozen
    from rlfleet.runtime.process_exit import without_final_collection
    from rlfleet.runtime.service_skeleton import run_service

    lines = _Lines()
    pending: list[dict[str, Any]] = []
    with imported_heap_frozen():
        spec = importlib.import_module(f"{module}.server").SPEC
        for name in (*spec.warm, *hints):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - a head start only: the service imports what it needs after "go"
                continue
            while lines.ready():                 # a check answered between imports, not after all of them
                line = lines.next()
                if line is None:                 # end of input: what came before it still counts ("go")
                    break
                message = json.loads(line)
                if "check" in message:
                    _answer(replies, message)
                else:
                    pending.append(message)
    while True:
        message = pending.pop(0) if pending else json.loads(lines.next() or "null")
        if message is None:
            return 0                         # end of input, never told to go
        if "check" in message:
            _answer(replies, message)
        elif "go" in message:
            replies.close()
            service_argv = _become(message["go"])
            sys.argv = [f"{module}/__main__.py", *service_argv]
            return without_final_collection(run_service(spec, service_argv))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
