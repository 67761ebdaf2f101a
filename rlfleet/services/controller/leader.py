"""Leader election through a coordination.k8s.io Lease: one controller acts, the others wait."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from rlfleet.services.controller.kube import MERGE_PATCH, status_of


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


class LeaseElector:
    def __init__(self, api: client.CoordinationV1Api, namespace: str, name: str, identity: str,
                 duration: float, clock: Callable[[], float]) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.clock = clock

    def _spec(self, now: float, acquired: float, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration),
                "acquireTime": _stamp(acquired), "renewTime": _stamp(now), "leaseTransitions": transitions}

    def try_acquire(self) -> bool:
        """Acquire or renew; False when another holder's lease is still valid or we lost a race (409)."""
        now = self.clock()
        try:
            lease = json.loads(self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False).data)
        except client.ApiException as exc:
            if status_of(exc) != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(now, now, 0)}
            try:
                self.api.create_namespaced_lease(self.namespace, body)
                return True
            except client.ApiException as exc2:
                if status_of(exc2) == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        if holder not in (None, "", self.identity) and now < renewed + duration:
            return False
        mine = holder == self.identity
        acquired = (_parse(spec.get("acquireTime")) or now) if mine else now
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        # A merge patch that carries the resourceVersion we read is conditional: of two contenders one gets 409.
        meta = ({"resourceVersion": lease["metadata"]["resourceVersion"]}
                if lease.get("metadata", {}).get("resourceVersion") else {})
        try:
            self.api.patch_namespaced_lease(self.name, self.namespace,
                                            {"metadata": meta, "spec": self._spec(now, acquired, transitions)},
                                            _content_type=MERGE_PATCH)
        except client.ApiException as exc:
            if status_of(exc) == 409:
                return False
            raise
        return True
