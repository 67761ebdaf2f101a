"""Dashboards and alerts read only what the real services export: the four services are started on loopback (as
the chart starts them) and their /metrics scraped. The controller's own metrics come from its registry served by
rlfleet.runtime.metrics.serve_metrics (it needs a Kubernetes API to start)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from rlfleet.runtime.metrics import ControllerMetrics, serve_metrics
from rlfleet.runtime.ports import free_port
from tests.cluster.exported import names_in_exposition, names_in_promql, scrape
from tests.cluster.live_services import SERVICES, LiveServices, write_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/rlfleet"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    from tests.support.tiny_model import make_tiny_model

    base = tmp_path_factory.mktemp("live")
    model = make_tiny_model(base / "model")
    config, ports = write_config(base / "run", model)
    services = LiveServices(config, ports, base)
    services.start()
    try:
        found = services.scrape_all(timeout=150)
        for name in SERVICES:
            assert name in found, f"{name} exported no metrics; its log:\n{services.log_tail(name)}"
        registry = CollectorRegistry()
        ControllerMetrics(registry)
        port = free_port()
        serve_metrics(registry, port, addr="127.0.0.1")
        found["controller"] = names_in_exposition(scrape(port))
        yield found
    finally:
        services.stop()


def _queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            out += [(f"{path.name}: {panel['title']}", t["expr"]) for t in panel["targets"]]
    for group in yaml.safe_load((CHART / "files/alerts.rules.yaml").read_text())["groups"]:
        out += [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in group["rules"]]
    return out


def test_every_dashboard_and_alert_query_reads_a_live_metric(live: dict[str, set[str]]) -> None:
    exported = set().union(*live.values())
    for where, expr in _queries():
        used = names_in_promql(expr)
        assert used, f"{where}: names no rlfleet metric"
        assert used <= exported, f"{where}: not exported by any live service: {sorted(used - exported)}"


def test_each_service_exports_its_own_families(live: dict[str, set[str]]) -> None:
    for service, names in live.items():
        prefix = f"rlfleet_{service}_"
        assert any(n.startswith(prefix) for n in names), service
    assert "rlfleet_rollout_generated_tokens_total" in live["rollout"]
    assert "rlfleet_trainer_step_seconds_bucket" in live["trainer"]
    assert "rlfleet_buffer_dropped_samples_total" in live["buffer"]
    assert "rlfleet_weight_sync_bytes_total" in live["weight_sync"]
