"""Recoveries survive a controller restart: each is a JSON record in the run's controller-state ConfigMap."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from kubernetes import client

from rlfleet.services.controller.kube import MERGE_PATCH, status_of

IN_PROGRESS, DONE, FAILED = "in_progress", "done", "failed"


@dataclass
class Recovery:
    id: str                         # short, ConfigMap-key safe
    kind: str
    key: str
    reason: str
    quarantine: list[str]
    delete_pods: list[list[str]]    # [name, uid]
    force: bool
    started_at: float
    status: str = IN_PROGRESS
    quarantined: list[str] = field(default_factory=list)   # steps done
    deleted: list[str] = field(default_factory=list)       # uids deleted (or found gone)
    finished_at: float | None = None
    note: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Recovery:
        return Recovery(**json.loads(text))


class RecoveryStore:
    def __init__(self, core: client.CoreV1Api, namespace: str, name: str) -> None:
        self.core = core
        self.namespace = namespace
        self.name = name

    def load(self) -> dict[str, Recovery]:
        try:
            raw: dict[str, Any] = json.loads(self.core.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False).data)
        except client.ApiException as exc:
            if status_of(exc) == 404:
                return {}
            raise
        return {k: Recovery.from_json(v) for k, v in (raw.get("data") or {}).items()}

    def save(self, rec: Recovery) -> None:
        """Write one record (create the ConfigMap on first use)."""
        patch = {"data": {rec.id: rec.to_json()}}
        try:
            self.core.patch_namespaced_config_map(self.name, self.namespace, patch, _content_type=MERGE_PATCH)
        except client.ApiException as exc:
            if status_of(exc) != 404:
                raise
            self.core.create_namespaced_config_map(self.namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/name": "rlfleet",
                                        "app.kubernetes.io/component": "controller-state"}},
                **patch})
