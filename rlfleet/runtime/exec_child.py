"""Become a command with the process attributes a supervisor wants its children to have, then exec it:
    python -m rlfleet.runtime.exec_child [--parent PID] [--cpus 0,1] -- COMMAND [ARGS...]

--parent PID: receive SIGTERM when that parent dies (Linux PDEATHSIG); if it is already gone, exit at once.
--cpus LIST: pin to these CPUs before the exec, so every thread the command ever starts inherits them.

Why a wrapper: `subprocess.Popen(preexec_fn=...)` runs Python code between fork and exec in a copy of a process
whose other threads (gRPC's event engine, torch's pools) did not come along, and gRPC's fork handlers then abort the
child now and then (a trainer rank died with SIGABRT, "epoll_wait error: Bad file descriptor", in one full test run
in two). Without preexec_fn, Popen starts the child with vfork/exec and no Python runs in between; the attributes
are set here instead, in a fresh single-threaded interpreter, and survive the exec. The session is Popen's own
`start_new_session=True`. Imports only the standard library: it adds ~20 ms to a child's start.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1


def wrap(command: Sequence[str], parent: int | None = None, cpus: Sequence[int] | None = None) -> list[str]:
    """The argv that runs `command` through this wrapper (parent: the pid whose death should end it)."""
    argv = [sys.executable, "-m", "rlfleet.runtime.exec_child"]
    if parent is not None:
        argv += ["--parent", str(parent)]
    if cpus is not None:
        argv += ["--cpus", ",".join(str(c) for c in cpus)]
    return [*argv, "--", *command]


def _die_with(parent: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        return  # not Linux: the parent's own cleanup still runs on every exit path it controls
    if os.getppid() != parent:  # the parent died before the prctl took effect: nobody would signal us
        sys.exit(f"exec_child: parent {parent} is gone")


def main(argv: Sequence[str]) -> None:
    args = list(argv)
    if "--" not in args or args.index("--") == len(args) - 1:
        sys.exit("usage: python -m rlfleet.runtime.exec_child [--parent PID] [--cpus 0,1] -- COMMAND [ARGS...]")
    split = args.index("--")
    options, command = args[:split], args[split + 1:]
    while options:
        flag, value, options = options[0], (options[1] if len(options) > 1 else ""), options[2:]
        if flag == "--parent" and value.isdigit():
            _die_with(int(value))
        elif flag == "--cpus" and value:
            os.sched_setaffinity(0, {int(c) for c in value.split(",")})
        else:
            sys.exit(f"exec_child: bad option {flag} {value!r}")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
