"""Read the rendered objects and check what the issue promises: placement, priority, network, non-root."""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.chart import (
    SCENARIOS,
    WORKLOAD_KINDS,
    all_pod_specs,
    by_kind,
    component,
    pod_spec,
    render,
    scenario_values,
)
from tests.cluster.tools import need_module

RACK = "topology.rlfleet.io/rack"
RUN_PORTS_NEVER_PUBLIC = {29500, 50054, 30000, 6379}   # rendezvous, weight data plane, SGLang HTTP, Redis


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    need_module("helm_python")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(scenario_values(name)) for name in SCENARIOS}


def _workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def _trainer(objects: list[dict]) -> dict:
    found = [o for o in objects if o["kind"] in ("StatefulSet", "JobSet")
             and o["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"]
    assert len(found) == 1
    return found[0]


def _rollout(objects: list[dict]) -> dict:
    found = [o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")
             and o["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout"]
    assert len(found) == 1
    return found[0]


def _priority(objects: list[dict], name: str) -> int:
    return next(p["value"] for p in by_kind(objects, "PriorityClass") if p["metadata"]["name"] == name)


def _quarantine_avoided(spec: dict, label: str = "rlfleet.io/quarantined") -> bool:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return all(any(e["key"] == label and e["operator"] == "DoesNotExist" for e in t["matchExpressions"])
               for t in terms)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_trainer_ranks_are_required_into_one_rack(rendered: dict, scenario: str) -> None:
    trainer = _trainer(rendered[scenario])
    spec = pod_spec(trainer)
    terms = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["topologyKey"] == RACK and t["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] ==
               "trainer" for t in terms)
    assert _quarantine_avoided(spec)
    if scenario.startswith("gpu"):
        values = scenario_values(scenario)
        assert (trainer["spec"].get("replicas") or
                trainer["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]) == 4
        racks = [e for t in spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                 ["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == RACK]
        assert racks and racks[0]["operator"] == "In" and racks[0]["values"] == values["topology"]["racks"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rollout_replicas_spread_across_racks(rendered: dict, scenario: str) -> None:
    rollout = _rollout(rendered[scenario])
    spec = pod_spec(rollout)
    tsc = [c for c in spec["topologySpreadConstraints"] if c["topologyKey"] == RACK]
    assert tsc and tsc[0]["whenUnsatisfiable"] == "DoNotSchedule" and tsc[0]["maxSkew"] == 1
    assert tsc[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "rollout"
    assert _quarantine_avoided(spec)
    racks = [e for t in spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
             ["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == RACK]
    if scenario.startswith("gpu"):     # pinned to topology.rolloutRacks: the racks the trainer does not fill
        assert [r["values"] for r in racks] == [["rack-b"]] and racks[0]["operator"] == "In"
    else:
        assert not racks
    if scenario == "gpu-64gpus-2racks":
        assert rollout["spec"]["replicas"] == 8


def test_rack_label_key_is_configurable() -> None:
    objects = render({"topology": {"rackLabel": "example.com/rack"}, "spares": {"count": 1}})
    keys = {t["topologyKey"] for t in pod_spec(_trainer(objects))["affinity"]["podAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]}
    assert keys == {"example.com/rack"}
    assert {c["topologyKey"] for c in pod_spec(_rollout(objects))["topologySpreadConstraints"]} >= {"example.com/rack"}
    assert RACK not in yaml.safe_dump(objects)


@pytest.mark.parametrize("scenario", ["gpu-spares", "gpu-integrations"])
def test_spares_sit_below_the_run_priority_on_the_trainer_racks(rendered: dict, scenario: str) -> None:
    objects = rendered[scenario]
    values = scenario_values(scenario)
    spares = component(objects, "Deployment", "spare")
    trainer = _trainer(objects)
    s_spec, t_spec = pod_spec(spares), pod_spec(trainer)
    assert spares["spec"]["replicas"] == values["spares"]["count"]
    spare_prio = _priority(objects, s_spec["priorityClassName"])
    run_prio = _priority(objects, t_spec["priorityClassName"])
    assert spare_prio < 0 < run_prio and run_prio - spare_prio >= 100000
    spare_pc = next(p for p in by_kind(objects, "PriorityClass")
                    if p["metadata"]["name"] == s_spec["priorityClassName"])
    assert spare_pc["preemptionPolicy"] == "Never"
    # Same racks: pinned to the run's racks and required into the trainer's rack.
    racks = [e for t in s_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
             ["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == RACK]
    assert racks[0]["values"] == values["topology"]["racks"]
    aff = s_spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert aff["topologyKey"] == RACK
    assert aff["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"
    # Holds the trainer's image (pre-pulled) and a rank's worth of GPUs.
    assert s_spec["containers"][0]["image"] == t_spec["containers"][0]["image"]
    assert (s_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] ==
            t_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == 8)
    assert _quarantine_avoided(s_spec)


def test_no_spares_no_spare_priority_class(rendered: dict) -> None:
    objects = rendered["gpu-64gpus-2racks"]
    assert not [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-spare")]
    assert len(by_kind(objects, "PriorityClass")) == 1


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_service_exposes_engine_or_collective_ports_outside_the_run(rendered: dict, scenario: str) -> None:
    objects = rendered[scenario]
    for svc in by_kind(objects, "Service"):
        spec = svc["spec"]
        assert spec.get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
        assert not spec.get("externalIPs") and not spec.get("loadBalancerIP")
        ports = {p["port"] for p in spec["ports"]}
        if ports & {29500, 50054}:
            assert spec.get("clusterIP") == "None", "rendezvous/data plane only on the headless trainer Service"
        assert 30000 not in ports
    for obj in _workloads(objects):
        for spec in all_pod_specs(obj):
            assert not spec.get("hostNetwork")
            for c in spec["containers"]:
                assert not any("hostPort" in p for p in c.get("ports", []))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_network_policies_allow_only_the_run_and_scraping(rendered: dict, scenario: str) -> None:
    objects = rendered[scenario]
    policies = by_kind(objects, "NetworkPolicy")
    run_sel = {"app.kubernetes.io/name": "rlfleet", "app.kubernetes.io/instance": "run1"}
    deny = [p for p in policies if p["spec"]["podSelector"].get("matchLabels") == run_sel
            and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} and "ingress" not in p["spec"]
            and "egress" not in p["spec"]]
    assert deny, "a default-deny policy covers every pod of the run"
    for pol in policies:
        for rule in pol["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                labels = peer.get("podSelector", {}).get("matchLabels") or {}
                inside = all(labels.get(k) == v for k, v in run_sel.items()) and "namespaceSelector" not in peer
                if not inside:
                    assert [p["port"] for p in rule.get("ports", [])] == [9400], pol["metadata"]["name"]
            assert rule.get("from"), "no ingress rule may allow every source"
    # Every pod of the run is selected by these policies.
    for obj in _workloads(objects):
        labels = (obj["spec"].get("template") or {}).get("metadata", {}).get("labels")
        if labels:
            assert all(labels.get(k) == v for k, v in run_sel.items()), obj["metadata"]["name"]


def test_network_policies_can_be_switched_off() -> None:
    assert not by_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_non_root_everywhere(rendered: dict, scenario: str) -> None:
    for obj in _workloads(rendered[scenario]):
        for spec in all_pod_specs(obj):
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, obj["metadata"]["name"]
            assert psc["seccompProfile"]["type"] == "RuntimeDefault"
            for c in spec["containers"] + spec.get("initContainers", []):
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert set(sc["capabilities"].get("add", [])) <= {"IPC_LOCK"}
                assert not sc.get("privileged") and sc.get("runAsUser", 1) != 0


def test_gpu_privileges_are_opt_in(rendered: dict) -> None:
    cpu = pod_spec(_trainer(rendered["cpu-minimal"]))
    assert "add" not in cpu["containers"][0]["securityContext"]["capabilities"] and not cpu.get("hostIPC")
    gpu = pod_spec(_trainer(rendered["gpu-64gpus-2racks"]))
    assert gpu["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"] and gpu["hostIPC"] is True
    assert gpu["containers"][0]["resources"]["limits"]["rdma/hca"] == 1
    default = pod_spec(_trainer(render({"trainer": {"gpusPerPod": 8}, "image": {"variant": "cuda"}})))
    assert "add" not in default["containers"][0]["securityContext"]["capabilities"]
    assert not default.get("hostIPC") and "rdma/hca" not in default["containers"][0]["resources"]["limits"]


def test_pdbs_for_redis_and_weight_sync(rendered: dict) -> None:
    pdbs = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
            for p in by_kind(rendered["cpu-minimal"], "PodDisruptionBudget")}
    assert pdbs == {"redis", "weight-sync"}


def test_resources_come_from_values(rendered: dict) -> None:
    spec = pod_spec(_trainer(rendered["gpu-64gpus-2racks"]))
    res = spec["containers"][0]["resources"]
    assert res["requests"]["cpu"] == "64" and res["limits"]["memory"] == "1400Gi"
    assert res["limits"]["nvidia.com/gpu"] == 8
    for obj in _workloads(rendered["cpu-minimal"]):
        for c in pod_spec(obj)["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"], obj["metadata"]["name"]


def test_services_start_with_the_documented_command_lines(rendered: dict) -> None:
    objects = rendered["cpu-minimal"]
    expect = {"buffer": 50051, "weight-sync": 50052, "trainer": 50053, "rollout": 50055}
    for comp, port in expect.items():
        obj = _trainer(objects) if comp == "trainer" else component(objects, "Deployment", comp)
        c = pod_spec(obj)["containers"][0]
        assert c["command"][:2] == ["python", "-m"]
        assert "--config=/etc/rlfleet/config.yaml" in c["args"] and f"--listen=0.0.0.0:{port}" in c["args"]
        assert "--metrics-port=9400" in c["args"]
        # mtls (the default): the image's check presents the pod's certificate (the kubelet's gRPC probe has none);
        # the trainer's asks rank 0 and passes on the other ranks
        hc = ["python", "/usr/local/bin/rlfleet-healthcheck"]
        assert c["readinessProbe"]["exec"]["command"] == hc and c["livenessProbe"]["exec"]["command"] == hc
        env = {e["name"]: e for e in c["env"]}
        assert env["RLFLEET_HEALTH_PORT"]["value"] == str(port)
        assert env["RLFLEET_PKI_DIR"]["value"] == "/etc/rlfleet-pki" and "RLFLEET_TOKEN" not in env
    rollout = pod_spec(component(objects, "Deployment", "rollout"))["containers"][0]
    assert "--replica-index=0" in rollout["args"] and "--replica-id=$(POD_NAME)" in rollout["args"]
    trainer = pod_spec(_trainer(objects))["containers"][0]
    env = {e["name"]: e for e in trainer["env"]}
    pod_index = env["RLFLEET_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod_index == "metadata.labels['apps.kubernetes.io/pod-index']" and "RANK" not in env
    assert env["MASTER_ADDR"]["value"] == "run1-trainer-0.run1-trainer.team-a.svc.cluster.local"


def test_run_config_gets_service_dns_endpoints_and_validates(rendered: dict) -> None:
    from rlfleet.config import parse_config

    for scenario in SCENARIOS:
        cm = next(o for o in by_kind(rendered[scenario], "ConfigMap") if o["metadata"]["name"] == "run1-config")
        cfg = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), scenario)
        assert cfg.endpoints.buffer == "run1-buffer.team-a.svc.cluster.local:50051"
        assert cfg.endpoints.weight_sync == "run1-weight-sync.team-a.svc.cluster.local:50052"
        assert cfg.endpoints.rendezvous.endswith(":29500") and cfg.endpoints.trainer_data.endswith(":50054")
        assert cfg.buffer.store == "redis" and "run1-redis" in cfg.buffer.redis_url
        assert cfg.security.mode == "mtls" and cfg.security.pki_dir == "/etc/rlfleet-pki"
        assert cfg.security.token_file is None
        assert cfg.run.resume is True
        assert (cfg.model.prepare is None) == scenario.startswith("gpu"), "no builder leaks into a GPU run"


def test_config_change_rolls_the_pods() -> None:
    a = pod_spec(_trainer(render()))
    b_obj = _trainer(render({"runConfig": {"trainer": {"lr": 0.5}}}))
    a_sum = _trainer(render())["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert b_obj["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != a_sum
    assert a["containers"]


def test_dashboards_ship_as_sidecar_configmaps(rendered: dict) -> None:
    maps = [o for o in by_kind(rendered["cpu-minimal"], "ConfigMap")
            if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(maps) >= 2 and all(k.endswith(".json") for m in maps for k in m["data"])


def test_redis_keeps_an_append_only_file_on_a_claim(rendered: dict) -> None:
    redis = component(rendered["cpu-minimal"], "StatefulSet", "redis")
    args = pod_spec(redis)["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
