"""python -m rlfleet.services.controller --namespace NS --release RUN [--config FILE] [--metrics-port 9400] ..."""

from __future__ import annotations

import logging
import sys
import threading
import time

from kubernetes import client, config
from prometheus_client import CollectorRegistry

from rlfleet.config import load_config
from rlfleet.runtime.metrics import ControllerMetrics, serve_metrics
from rlfleet.security.credentials import load_credential
from rlfleet.services.controller.controller import Controller
from rlfleet.services.controller.events import EventRecorder
from rlfleet.services.controller.grpc_progress import GrpcProgress
from rlfleet.services.controller.kube import Kube
from rlfleet.services.controller.leader import LeaseElector
from rlfleet.services.controller.recovery import RecoveryRunner
from rlfleet.services.controller.settings import Settings, parse_settings
from rlfleet.services.controller.store import RecoveryStore
from rlfleet.services.controller.watcher import ListWatch

log = logging.getLogger("rlfleet.controller")


def build(settings: Settings, api_client: client.ApiClient, metrics: ControllerMetrics) -> Controller:
    kube = Kube(api_client, settings.namespace, settings.run_selector, settings.quarantine_label)
    events = EventRecorder(kube.core, settings.namespace, settings.identity)
    store = RecoveryStore(kube.core, settings.namespace, settings.state_name)
    progress = None
    if settings.config_path:
        cfg = load_config(settings.config_path)
        progress = GrpcProgress(cfg, load_credential(cfg.security, "controller", name="controller"))
    runner = RecoveryRunner(kube, events, store, metrics, settings.quarantine_taint, settings.recovery_timeout,
                            tickets_in_flight=progress.tickets_in_flight if progress else None)
    return Controller(settings, kube, store, runner, progress, metrics, time.time)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s controller %(levelname)s %(message)s")
    settings = parse_settings(argv)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api_client = client.ApiClient()
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    serve_metrics(registry, settings.metrics_port)
    controller = build(settings, api_client, metrics)
    elector = LeaseElector(controller.kube.coordination, settings.namespace, settings.lease_name, settings.identity,
                           settings.lease_seconds, time.time)
    wake = threading.Event()
    relist = lambda resource: metrics.relists.labels(resource=resource).inc()  # noqa: E731
    watches = [
        ListWatch(controller.kube.core.list_namespaced_pod, "pods", wake.set, relist,
                  namespace=settings.namespace, label_selector=settings.run_selector),
        ListWatch(controller.kube.core.list_node, "nodes", wake.set, relist),
    ]
    for w in watches:
        threading.Thread(target=w.run, name=f"watch-{w.resource}", daemon=True).start()
    log.info("controller %s for run %s in %s", settings.identity, settings.release, settings.namespace)
    while True:
        try:
            leader = elector.try_acquire()
            metrics.is_leader.set(1 if leader else 0)
            if leader:
                controller.reconcile()
        except Exception:  # noqa: BLE001 - log and try again next tick; never crash-loop the on-call
            log.exception("reconcile failed")
        wake.wait(settings.tick_seconds)
        wake.clear()


if __name__ == "__main__":
    raise SystemExit(main())
