"""Grafana dashboards: valid JSON, a datasource variable, no hard-coded ids, and every panel query names a metric
that a live /metrics endpoint really exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.runtime.metrics import serve_metrics
from rlfleet.runtime.ports import free_port
from tests.cluster.exported import names_in_exposition, names_in_promql, scrape, sdk_registry

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "deploy/helm/rlfleet/dashboards").glob("*.json"))


def _targets(dashboard: dict) -> list[dict]:
    panels = list(dashboard["panels"])
    for p in dashboard["panels"]:
        panels += p.get("panels", [])
    return [t for p in panels for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def live_names() -> set[str]:
    """Scraped over HTTP from rlfleet.runtime.metrics.serve_metrics serving every SDK metric class."""
    port = free_port()
    serve_metrics(sdk_registry(), port, addr="127.0.0.1")
    names = names_in_exposition(scrape(port))
    assert "rlfleet_trainer_step" in names and "rlfleet_buffer_dropped_samples_total" in names
    return names


def test_there_are_dashboards() -> None:
    assert len(DASHBOARDS) >= 2


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_shape(path: Path) -> None:
    d = json.loads(path.read_text())
    assert d.get("id") is None, "no hard-coded dashboard id"
    assert d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in d["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
    assert '"uid": "prometheus"' not in path.read_text()


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_names_an_exported_metric(path: Path, live_names: set[str]) -> None:
    for target in _targets(json.loads(path.read_text())):
        used = names_in_promql(target["expr"])
        assert used, f"{path.name}: query names no rlfleet metric: {target['expr']}"
        assert used <= live_names, f"{path.name}: not exported: {sorted(used - live_names)}"


def test_issue_metrics_are_on_the_dashboards() -> None:
    text = " ".join(t["expr"] for p in DASHBOARDS for t in _targets(json.loads(p.read_text())))
    for needed in ("rlfleet_rollout_generated_tokens_total", "rlfleet_rollout_queue_depth", "rlfleet_buffer_depth",
                   "rlfleet_buffer_dropped_samples_total", "rlfleet_buffer_staleness_versions_bucket",
                   "rlfleet_trainer_step_seconds_bucket", "rlfleet_trainer_loss", "rlfleet_trainer_reward_mean",
                   "rlfleet_trainer_tis_ratio_mean", "rlfleet_weight_sync_seconds_bucket",
                   "rlfleet_weight_sync_bytes_total", "rlfleet_weight_sync_replica_version"):
        assert needed in text, needed
