"""Read-only views of the pod and node JSON the API returns: only the facts the decisions use."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str
    component: str
    node: str | None
    phase: str
    ready: bool
    ready_changed_at: float | None        # lastTransitionTime of the Ready condition
    created_at: float | None
    deleting: bool
    crash_looping: bool                   # a container waits in CrashLoopBackOff
    failed_exit: bool                     # a container terminated with a non-zero code (now or last time)
    exits: tuple[tuple[int, str], ...] = ()   # those terminations (exit code, kubelet reason), current ones first
    ip: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Pod:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready = _condition(obj, "Ready")
        crash = False
        now: list[tuple[int, str]] = []
        last: list[tuple[int, str]] = []
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            crash = crash or waiting.get("reason") == "CrashLoopBackOff"
            for into, term in ((now, (cs.get("state") or {}).get("terminated")),
                               (last, (cs.get("lastState") or {}).get("terminated"))):
                if term and term.get("exitCode", 0) != 0:
                    into.append((int(term["exitCode"]), str(term.get("reason") or "")))
        labels = meta.get("labels") or {}
        return Pod(name=meta.get("name", ""), uid=meta.get("uid", ""),
                   component=labels.get("app.kubernetes.io/component", ""), node=spec.get("nodeName"),
                   phase=status.get("phase", "Pending"), ready=bool(ready and ready.get("status") == "True"),
                   ready_changed_at=parse_time(ready.get("lastTransitionTime")) if ready else None,
                   created_at=parse_time(meta.get("creationTimestamp")), deleting=bool(meta.get("deletionTimestamp")),
                   crash_looping=crash, failed_exit=bool(now or last), exits=(*now, *last), ip=status.get("podIP"),
                   labels=labels)


@dataclass(frozen=True)
class Node:
    name: str
    ready: bool                           # Ready condition True (False or Unknown: the node is lost)
    quarantined: bool
    taints: tuple[dict[str, Any], ...]
    rack: str | None = None

    @staticmethod
    def from_json(obj: dict[str, Any], quarantine_label: str, rack_label: str = "") -> Node:
        meta = obj.get("metadata", {})
        labels = meta.get("labels") or {}
        cond = _condition(obj, "Ready")
        return Node(name=meta.get("name", ""), ready=cond is None or cond.get("status") == "True",
                    quarantined=quarantine_label in labels, taints=tuple(obj.get("spec", {}).get("taints") or ()),
                    rack=labels.get(rack_label) if rack_label else None)


@dataclass(frozen=True)
class Snapshot:
    """The run's pods and the nodes they run on, at one moment."""

    now: float
    pods: tuple[Pod, ...]
    nodes: dict[str, Node]

    def component(self, name: str) -> list[Pod]:
        return [p for p in self.pods if p.component == name]
