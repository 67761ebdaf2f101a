"""The few Kubernetes API calls the controller makes, through the official client, on plain JSON."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from rlfleet.services.controller.objects import Node, Pod, Snapshot

MERGE_PATCH = "application/merge-patch+json"


def status_of(exc: client.ApiException) -> int:
    return int(getattr(exc, "status", 0) or 0)


class Kube:
    def __init__(self, api_client: client.ApiClient, namespace: str, selector: str, quarantine_label: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.selector = selector
        self.quarantine_label = quarantine_label
        self._wanted = dict(kv.split("=", 1) for kv in selector.split(","))

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        return json.loads(resp.data)

    def run_pods(self) -> list[dict[str, Any]]:
        items = self._json(self.core.list_namespaced_pod(self.namespace, label_selector=self.selector,
                                                         _preload_content=False)).get("items", [])
        # The selector is also applied here: the API may be a test double that ignores it.
        return [p for p in items if all((p.get("metadata", {}).get("labels") or {}).get(k) == v
                                        for k, v in self._wanted.items())]

    def node(self, name: str) -> dict[str, Any] | None:
        try:
            return self._json(self.core.read_node(name, _preload_content=False))
        except client.ApiException as exc:
            if status_of(exc) == 404:
                return None
            raise

    def snapshot(self, now: float) -> Snapshot:
        pods = tuple(Pod.from_json(p) for p in self.run_pods())
        nodes: dict[str, Node] = {}
        for name in sorted({p.node for p in pods if p.node}):
            raw = self.node(name)
            if raw is not None:
                nodes[name] = Node.from_json(raw, self.quarantine_label)
        return Snapshot(now=now, pods=pods, nodes=nodes)

    def quarantine(self, name: str, taint_key: str, reason: str) -> bool:
        """Label and taint the node (NoSchedule). Returns False when it already was (idempotent)."""
        raw = self.node(name)
        if raw is None:
            return False
        labels = raw.get("metadata", {}).get("labels") or {}
        taints = list(raw.get("spec", {}).get("taints") or [])
        has_taint = any(t.get("key") == taint_key for t in taints)
        if self.quarantine_label in labels and has_taint:
            return False
        if not has_taint:
            taints.append({"key": taint_key, "value": "true", "effect": "NoSchedule"})
        self.core.patch_node(name, {"metadata": {"labels": {self.quarantine_label: "true"},
                                                 "annotations": {f"{self.quarantine_label}-reason": reason[:250]}},
                                    "spec": {"taints": taints}}, _content_type=MERGE_PATCH)
        return True

    def delete_pod(self, name: str, uid: str, force: bool) -> bool:
        """Delete this incarnation of the pod (uid precondition). False when it is gone already."""
        body = {"preconditions": {"uid": uid}, **({"gracePeriodSeconds": 0} if force else {})}
        try:
            self.core.delete_namespaced_pod(name, self.namespace, body=body)
            return True
        except client.ApiException as exc:
            if status_of(exc) in (404, 409):
                return False
            raise
