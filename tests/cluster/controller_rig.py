"""A controller wired to kmock's in-memory Kubernetes API, with a test clock and a scripted trainer progress."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from rlfleet.runtime.metrics import ControllerMetrics
from rlfleet.services.controller.controller import Controller
from rlfleet.services.controller.events import EventRecorder
from rlfleet.services.controller.kube import Kube
from rlfleet.services.controller.progress import TrainerProgress
from rlfleet.services.controller.recovery import RecoveryRunner
from rlfleet.services.controller.settings import Settings
from rlfleet.services.controller.store import RecoveryStore
from tests.cluster.k8s_objects import NAMESPACE, RELEASE
from tests.cluster.kmock_server import KmockApi


@dataclass
class Clock:
    now: float = 2000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedProgress:
    progress: TrainerProgress = field(default_factory=lambda: TrainerProgress(step=None, ready_groups=None))
    tickets: int | None = 12

    def read(self, trainer_pods: list[tuple[str, str | None]]) -> TrainerProgress:
        return self.progress

    def tickets_in_flight(self) -> int | None:
        return self.tickets


SETTINGS = Settings(namespace=NAMESPACE, release=RELEASE, identity="controller-a", hung_after=600.0,
                    replica_dead_after=300.0, recovery_timeout=1800.0)


def build_controller(api: KmockApi, clock: Clock, progress: ScriptedProgress,
                     kube_cls: Callable[..., Kube] = Kube) -> tuple[Controller, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    kube = kube_cls(api.api_client(), SETTINGS.namespace, SETTINGS.run_selector, SETTINGS.quarantine_label)
    events = EventRecorder(kube.core, SETTINGS.namespace, SETTINGS.identity)
    store = RecoveryStore(kube.core, SETTINGS.namespace, SETTINGS.state_name)
    runner = RecoveryRunner(kube, events, store, metrics, SETTINGS.quarantine_taint, SETTINGS.recovery_timeout,
                            tickets_in_flight=progress.tickets_in_flight)
    return Controller(SETTINGS, kube, store, runner, progress, metrics, clock), registry


class Cluster:
    """Direct API access for the test itself: seed objects, flip node state, read what the controller did."""

    def __init__(self, api: KmockApi) -> None:
        self.api = api
        self.core = client.CoreV1Api(api.api_client())

    def add_node(self, obj: dict[str, Any]) -> None:
        self.core.create_node(obj)

    def add_pod(self, obj: dict[str, Any]) -> None:
        self.core.create_namespaced_pod(NAMESPACE, obj)

    def set_node_ready(self, name: str, ready: bool) -> None:
        self.core.patch_node(name, {"status": {"conditions": [{"type": "Ready",
                                                               "status": "True" if ready else "Unknown"}]}},
                             _content_type="application/merge-patch+json")

    def node(self, name: str) -> dict[str, Any]:
        return json.loads(self.core.read_node(name, _preload_content=False).data)

    def pods(self) -> dict[str, dict[str, Any]]:
        data = json.loads(self.core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)
        return {p["metadata"]["name"]: p for p in data["items"]}

    def events(self) -> list[dict[str, Any]]:
        data = json.loads(self.core.list_namespaced_event(NAMESPACE, _preload_content=False).data)
        return data["items"]

    def reasons(self) -> list[str]:
        return sorted(e["reason"] for e in self.events())

    def requests(self, method: str, plural: str) -> list[Any]:
        return [r for r in self.api.requests()
                if str(r.method).upper().endswith(method) and r.resource is not None and r.resource.plural == plural]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
