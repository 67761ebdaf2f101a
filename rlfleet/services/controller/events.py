"""Kubernetes Events for every controller action. Names are derived from the recovery, so a controller that
restarts and repeats a step creates no second Event (the API answers 409 and that is fine)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from kubernetes import client

from rlfleet.services.controller.kube import status_of

COMPONENT = "rlfleet-controller"


class EventRecorder:
    def __init__(self, core: client.CoreV1Api, namespace: str, identity: str) -> None:
        self.core = core
        self.namespace = namespace
        self.identity = identity

    def record(self, dedup_key: str, kind: str, name: str, reason: str, message: str,
               warning: bool = False, namespaced: bool = True) -> bool:
        digest = hashlib.sha256(dedup_key.encode()).hexdigest()[:16]
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name[:200]}.{digest}", "namespace": self.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name,
                               **({"namespace": self.namespace} if namespaced else {})},
            "reason": reason, "message": message[:1000], "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": self.identity, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.core.create_namespaced_event(self.namespace, body)
            return True
        except client.ApiException as exc:
            if status_of(exc) == 409:
                return False
            raise
