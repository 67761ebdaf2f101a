"""Child processes of a local run: started in their own session, killed with their parent, logged to files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlfleet.runtime.exec_child import wrap


class Child:
    """One service process with its log file."""

    def __init__(self, name: str, args: Sequence[str], log_path: Path, env: dict[str, str],
                 cpus: Sequence[int] | None = None, proc: subprocess.Popen | None = None) -> None:
        """Starts `python ARGS...`, or adopts `proc`: a warm interpreter already told to become this service and
        to log to log_path (rlfleet/local/warm_interpreters.py), started with the same wrapper and session."""
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        # own session (Ctrl-C reaches only the launcher), SIGTERM when the launcher dies, pinned to `cpus`: set by
        # rlfleet.runtime.exec_child after the fork, not by a preexec_fn in this gRPC-threaded process (see there)
        self.proc = proc or subprocess.Popen(wrap([sys.executable, *args], parent=os.getpid(), cpus=cpus),
                                             stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, start_new_session=True)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def terminate(self) -> None:
        """SIGTERM the child's process group and return at once (it drains and exits in its own time)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the child's whole process group, SIGKILL after grace seconds."""
        stop_together([self], grace)

    def _kill_and_close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._log.close()


def stop_together(children: Sequence[Child], grace: float = 10.0) -> None:
    """SIGTERM every child's process group at once, wait for them all (grace seconds in all), SIGKILL the rest."""
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace
    while any(c.proc.poll() is None for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in children:
        child._kill_and_close()


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
