"""One trainer pod, several ranks: start a child process per rank (one per GPU), supervise them as a gang.

The gang rule is the trainer's: a rank that fails takes its pod down (its siblings are stopped, the pod exits with
the failing rank's code, and the controller restarts the gang from the last checkpoint). SIGTERM to the pod reaches
every rank. Children die with the supervisor (PDEATHSIG), so a killed pod leaves no orphan rank holding a GPU.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from rlfleet.runtime.exec_child import wrap
from rlfleet.services.trainer.ranks import RankPlacement, rank_env

log = logging.getLogger(__name__)

STOP_GRACE = 30.0     # seconds a sibling gets between SIGTERM and SIGKILL once the gang is going down


def trainer_rank_command(argv: Sequence[str]) -> Callable[[RankPlacement], list[str]]:
    """The command line of one rank: this same trainer entry point with the same arguments."""
    return lambda _p: [sys.executable, "-m", "rlfleet.services.trainer", *argv]


def run_local_ranks(placements: Sequence[RankPlacement], command: Callable[[RankPlacement], list[str]],
                    base_env: Mapping[str, str] | None = None, poll: float = 0.2) -> int:
    """Run one child per placement until all exit 0 (-> 0) or one fails (-> its code, siblings stopped)."""
    env = dict(os.environ if base_env is None else base_env)
    env.pop("RLFLEET_RANKS_PER_POD", None)      # a child is one rank: it must not supervise again
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for p in placements:
        procs[p.rank] = subprocess.Popen(wrap(command(p), parent=os.getpid()), env={**env, **rank_env(p)},
                                         stdin=subprocess.DEVNULL)
    stopping = {"signal": 0}

    def forward(signum: int, _frame: object) -> None:
        stopping["signal"] = signum
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            codes = {rank: proc.poll() for rank, proc in procs.items()}
            failed = {rank: c for rank, c in codes.items() if c is not None and c != 0}
            if failed:
                rank, code = min(failed.items())
                log.error("trainer rank %d exited with %s: stopping the other ranks of this pod", rank, code)
                _stop_all(procs)
                return code if code > 0 else 128 - code
            if all(c == 0 for c in codes.values()):
                return 0
            time.sleep(poll)
    finally:
        _stop_all(procs)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_all(procs: Mapping[int, subprocess.Popen[bytes]]) -> None:
    live = [p for p in procs.values() if p.poll() is None]
    for proc in live:
        proc.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
