"""rlfleet.runtime.process_exit: a process that skips its last collection still exits with its code, runs its atexit
handlers and flushes its logs (what the services' `__main__` and the `rlfleet` command rely on)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import atexit, logging, sys
sys.path.insert(0, {root!r})
from rlfleet.runtime.process_exit import without_final_collection
logging.basicConfig(filename={log!r}, level=logging.INFO)
atexit.register(lambda: open({marker!r}, "w").write("atexit ran"))
cycle = [];  cycle.append(cycle)              # cyclic garbage left at exit: not collected, the process still ends
logging.getLogger("child").info("last line")
raise SystemExit(without_final_collection(3))
"""


def test_exit_code_atexit_and_log_flush_survive(tmp_path: Path) -> None:
    log, marker = tmp_path / "child.log", tmp_path / "marker"
    code = CHILD.format(root=str(ROOT), log=str(log), marker=str(marker))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3, result.stderr
    assert marker.read_text() == "atexit ran"
    assert log.read_text().strip().endswith("last line")
