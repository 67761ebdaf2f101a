"""Pod and node JSON as the API server returns them, for the controller tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

RELEASE = "run1"
NAMESPACE = "team-a"


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, component: str, node: str, uid: str | None = None, ready: bool = True, phase: str = "Running",
        ready_since: float = 1000.0, created: float = 900.0, exit_code: int | None = None, reason: str = "Error",
        crash_loop: bool = False, ip: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase, "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                        "lastTransitionTime": stamp(ready_since)}],
    }
    cs: dict[str, Any] = {"name": component, "ready": ready, "restartCount": 0, "state": {"running": {}},
                          "image": "rlfleet", "imageID": "sha256:0"}
    if exit_code is not None:
        cs["lastState"] = {"terminated": {"exitCode": exit_code, "reason": reason}}
        cs["restartCount"] = 1
    if crash_loop:
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    status["containerStatuses"] = [cs]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid or f"uid-{name}",
                     "creationTimestamp": stamp(created),
                     "labels": {"app.kubernetes.io/name": "rlfleet", "app.kubernetes.io/instance": RELEASE,
                                "app.kubernetes.io/component": component}},
        "spec": {"nodeName": node, "containers": [{"name": component, "image": "rlfleet"}]},
        "status": status,
    }


def node(name: str, ready: bool = True, rack: str = "rack-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.rlfleet.io/rack": rack}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]}}
