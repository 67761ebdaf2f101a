"""The controller's command line is the one the chart renders, and its process wiring builds against a real client."""

from __future__ import annotations

from tests.cluster.tools import need_module

need_module("kubernetes", module_level=True)
need_module("kmock", module_level=True)

import yaml  # noqa: E402
from kubernetes import client  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from rlfleet.runtime.metrics import ControllerMetrics  # noqa: E402
from rlfleet.services.controller.__main__ import build  # noqa: E402
from rlfleet.services.controller.settings import parse_settings  # noqa: E402
from tests.cluster.chart import by_kind, component, pod_spec, render  # noqa: E402


def test_chart_args_parse_and_the_controller_builds(tmp_path, monkeypatch) -> None:
    need_module("helm_python")
    objects = render({"controller": {"hungAfterSeconds": 1200, "replicaDeadAfterSeconds": 240},
                      "security": {"mode": "token"}})      # (mtls, the default: tests/cluster/test_chart_mtls.py)
    container = pod_spec(component(objects, "Deployment", "controller"))["containers"][0]
    assert container["command"] == ["python", "-m", "rlfleet.services.controller"]
    config = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "run1-config")
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(config["data"]["config.yaml"])
    args = [a.replace("/etc/rlfleet/config.yaml", str(cfg_path)) for a in container["args"]]
    env = {e["name"]: e for e in container["env"]}
    assert env["RLFLEET_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"   # the pod's credential...
    monkeypatch.setenv("RLFLEET_TOKEN", "from-the-secret")                        # ...as the pod sees it
    settings = parse_settings([*args, "--identity", "run1-controller-abc"])
    assert settings.namespace == "team-a" and settings.release == "run1"
    assert settings.hung_after == 1200 and settings.replica_dead_after == 240 and settings.metrics_port == 9400
    assert settings.run_selector == "app.kubernetes.io/name=rlfleet,app.kubernetes.io/instance=run1"
    controller = build(settings, client.ApiClient(), ControllerMetrics(CollectorRegistry()))
    assert controller.progress is not None and controller.store.name == "run1-controller-state"
    assert yaml.safe_load(cfg_path.read_text())["endpoints"]["trainer"].startswith("run1-trainer-0.run1-trainer.")


def test_controller_rbac_is_namespaced_except_nodes() -> None:
    need_module("helm_python")
    objects = render()
    (role,) = by_kind(objects, "Role")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "events", "configmaps", "leases"}
    assert "create" not in next(r for r in role["rules"] if r["resources"] == ["pods"])["verbs"]
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                      "verbs": ["get", "list", "watch", "patch"]}]
