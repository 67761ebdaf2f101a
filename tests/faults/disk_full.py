"""A full disk for one live process: writes past `size` bytes of any file fail with EFBIG (RLIMIT_FSIZE; Python
ignores SIGXFSZ) until space returns. Used by both harness modes."""

from __future__ import annotations

import resource
import time


def fill_disk_for(pid: int, size: int, seconds: float) -> None:
    """Hold `pid`'s file-size limit at `size` bytes for `seconds`, then restore it."""
    hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, hard))
    time.sleep(seconds)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
