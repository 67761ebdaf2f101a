"""A trainer rank that is its container's PID 1 ends on SIGTERM (a deleted pod), as it does anywhere else; without
the handler the kernel spares PID 1 and the signal is ignored until the grace period's SIGKILL. Checked in a PID
namespace of its own (`unshare --pid`, as a container runs it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cluster.tools import need_binary

ROOT = Path(__file__).resolve().parents[2]
BODY = ("import os, sys, time\n{setup}\nprint(os.getpid(), flush=True)\ntime.sleep(20)\n")


def _pid1(setup: str) -> tuple[subprocess.Popen[str], int]:
    """A python that is PID 1 of a new PID namespace; returns (unshare's process, the python's pid here)."""
    proc = subprocess.Popen([need_binary("unshare"), "--pid", "--fork", "--kill-child", sys.executable, "-c",
                             BODY.format(setup=setup)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "1"      # PID 1 inside
    child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    return proc, child


def test_sigterm_ends_a_rank_that_is_pid_1() -> None:
    proc, child = _pid1("from rlfleet.services.trainer.server import sigterm_ends_pid_1\nsigterm_ends_pid_1()")
    os.kill(child, signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM

    control, child = _pid1("")                     # no handler: PID 1 ignores SIGTERM
    try:
        os.kill(child, signal.SIGTERM)
        time.sleep(1.0)
        assert control.poll() is None
    finally:
        control.kill()
        control.wait()
