"""The controller's one rule on a failed container: whether its node is at fault (quarantine: taint and label it) or
the application is (restart, never quarantine). A crash that is the run's own, from a bad sample to a config error,
would otherwise taint one healthy node per restart.

Node-level signals only: the node going NotReady/Unknown (decisions.py, before any exit code is read), a process
that found its accelerator faulty (exit DEVICE_FAULT, rlfleet/runtime/exit_codes.py), SIGBUS (what the kernel sends on
an
uncorrectable memory error). Everything else restarts without quarantine: rlfleet's own codes, the kernel's OOM
kill (the run's sizing), kills from outside (eviction, preemption, deletion), native crashes (SIGSEGV, SIGABRT:
software, usually) and any code not listed. A hung rank is judged by its progress, not here (progress.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

from rlfleet.runtime.exit_codes import DEVICE_FAULT, FAILED, GAVE_UP, USAGE


@dataclass(frozen=True)
class ExitRule:
    node_fault: bool         # quarantine the node the container ran on
    why: str


def _signal(sig: signal.Signals) -> int:
    return 128 + int(sig)           # how a container killed by a signal reports its exit code


BY_EXIT_CODE: dict[int, ExitRule] = {
    FAILED: ExitRule(False, "application error"),
    USAGE: ExitRule(False, "bad arguments or config"),
    GAVE_UP: ExitRule(False, "stopped on purpose (engine unhealthy, buffer superseded)"),
    DEVICE_FAULT: ExitRule(True, "the process found its accelerator faulty"),
    _signal(signal.SIGBUS): ExitRule(True, "SIGBUS: a hardware memory error"),
    _signal(signal.SIGKILL): ExitRule(False, "SIGKILL from outside (OOM killer, eviction, preemption)"),
    _signal(signal.SIGTERM): ExitRule(False, "SIGTERM (deleted or preempted)"),
    _signal(signal.SIGABRT): ExitRule(False, "SIGABRT: a native abort (watchdog, assertion)"),
    _signal(signal.SIGSEGV): ExitRule(False, "SIGSEGV: a native crash"),
}
BY_REASON: dict[str, ExitRule] = {                 # the kubelet's termination reason, read before the code
    "OOMKilled": ExitRule(False, "OOM-killed at the container's memory limit: the run's sizing"),
}
UNLISTED = ExitRule(False, "exit code not listed: restart only")
NO_EXIT = ExitRule(False, "no container exit recorded (evicted or never started): restart only")


def rule_for(code: int, reason: str = "") -> ExitRule:
    return BY_REASON.get(reason) or BY_EXIT_CODE.get(code, UNLISTED)


def judge(exits: Iterable[tuple[int, str]]) -> tuple[ExitRule, str]:
    """(the rule, one line naming the exit) for a pod's non-zero container exits, newest first: the first that is
    the node's fault decides, else the newest."""
    listed = list(exits)
    if not listed:
        return NO_EXIT, NO_EXIT.why
    rules = [(rule_for(code, reason), code, reason) for code, reason in listed]
    rule, code, reason = next((r for r in rules if r[0].node_fault), rules[0])
    return rule, f"exit {code}{f' ({reason})' if reason else ''}: {rule.why}"
