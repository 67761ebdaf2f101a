"""rlfleet.runtime.exec_child: a child pinned and tied to its parent without a preexec_fn (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rlfleet.runtime.exec_child import wrap


def _state(pid: int) -> str:
    """The process's state letter (R, S, Z, ...), or "" when it no longer exists."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_the_command_runs_pinned_with_its_arguments() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    out = subprocess.run(wrap([sys.executable, "-c", "import os, sys; print(sorted(os.sched_getaffinity(0)), "
                               "sys.argv[1:])", "a b", "c"], parent=os.getpid(), cpus=[cpu]),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[{cpu}] ['a b', 'c']"


def test_a_child_gets_sigterm_when_its_parent_dies(tmp_path: Path) -> None:
    # the parent starts a sleeping child through the wrapper, writes its pid, then dies without cleaning up
    parent = ("import os, subprocess, sys, time; from rlfleet.runtime.exec_child import wrap; "
              "p = subprocess.Popen(wrap([sys.executable, '-c', 'import time; time.sleep(120)'], parent=os.getpid())); "
              "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(1.0); os._exit(0)")
    pid_file = tmp_path / "pid"
    subprocess.run([sys.executable, "-c", parent, str(pid_file)], timeout=60, check=True,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 20
    while _state(child) not in ("", "Z", "X"):
        assert time.monotonic() < deadline, f"the orphaned child {child} is still running"
        time.sleep(0.05)


def test_a_parent_already_gone_or_a_bad_option_ends_the_child_with_a_reason() -> None:
    gone = subprocess.run(wrap([sys.executable, "-c", "print('ran')"], parent=2**22 + 7), capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 1 and "is gone" in gone.stderr and "ran" not in gone.stdout
    bad = subprocess.run([sys.executable, "-m", "rlfleet.runtime.exec_child", "--cpus", "", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "bad option --cpus" in bad.stderr
    usage = subprocess.run([sys.executable, "-m", "rlfleet.runtime.exec_child", "true"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 1 and "usage:" in usage.stderr
