"""A full disk for one live process: writes past `size` bytes of any file fail with EFBIG (RLIMIT_FSIZE; Python
ignores SIGXFSZ) until space returns. Used by both harness modes."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from rlfleet.services.buffer.stores.logfile import scan


def fill_disk_for(pid: int, size: int, seconds: float) -> None:
    """Hold `pid`'s file-size limit at `size` bytes for `seconds`, then restore it."""
    hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, hard))
    time.sleep(seconds)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))


def log_end(path: Path) -> int:
    """Where the buffer's next commit goes: the end of the log's last intact frame. The live file goes on past it
    with zeros the buffer wrote ahead (already allocated, so a real full disk would still take commits there; the
    fault fills the disk from the log's end so that the next commit meets it)."""
    return scan(path).end
