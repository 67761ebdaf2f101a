"""The chart-to-podman adapter's mapping (tests/cluster/play/plan.py), checked against the rendered objects read
independently here: every address the run config dials is a network alias of a pod that listens on that port; every
rendered mount is mapped with its read-only flag; every rendered object is either played or named in the
not-enforced list; Secret files are projected as the kubelet projects them; env from the downward API and Secrets
is filled in. Runs without podman (nothing is started).
"""

from __future__ import annotations

import base64
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.chart import VALUES, merge, render
from tests.cluster.play.files import write_volume
from tests.cluster.play.issuer import PlayIssuer
from tests.cluster.play.plan import Plan, PlanError, existing_secrets, make_plan
from tests.cluster.play.secrets import make_existing_secrets
from tests.cluster.tools import need_module

NS = "play"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    need_module("helm_python")
    values = yaml.safe_load((VALUES / "play-cpu.yaml").read_text())
    secrets = tmp_path_factory.mktemp("secrets")
    make_existing_secrets(secrets, values, "add1", NS)
    return render(values, release="add1", namespace=NS), values, secrets


@pytest.fixture(scope="module")
def plan(rendered: tuple[list[dict[str, Any]], dict[str, Any], Path]) -> Plan:
    objects, _, secrets = rendered
    return make_plan(objects, "add1", NS, existing_secrets(secrets))


def test_every_endpoint_the_config_dials_is_an_alias_of_a_pod_listening_there(
        rendered: tuple[list[dict[str, Any]], dict[str, Any], Path], plan: Plan) -> None:
    objects = rendered[0]
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                                 and "config.yaml" in o.get("data", {}))["data"]["config.yaml"])
    dialled = [config["endpoints"][k] for k in ("buffer", "weight_sync", "trainer", "trainer_data", "rendezvous")]
    dialled += list(config["endpoints"]["rollout"])
    dialled.append(config["buffer"]["redis_url"].split("//", 1)[1].split("/", 1)[0])
    workload_ports = {(o["kind"], o["metadata"]["name"]): {p["containerPort"] for p in
                                                           o["spec"]["template"]["spec"]["containers"][0]["ports"]}
                      for o in objects if o["kind"] in ("Deployment", "StatefulSet")}
    for address in dialled:
        host, port = address.rsplit(":", 1)
        pods = [p for p in plan.pods.values() if host in p.aliases]
        assert pods, f"{address}: no played pod answers to {host}"
        for p in pods:
            kind, name = p.workload.split("/", 1)
            assert int(port) in workload_ports[(kind, name)], f"{address}: pod {p.name} does not listen on {port}"


def test_every_rendered_mount_is_mapped_with_its_read_only_flag(
        rendered: tuple[list[dict[str, Any]], dict[str, Any], Path], plan: Plan) -> None:
    objects = rendered[0]
    for o in objects:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pods = [p for p in plan.pods.values() if p.workload == f"{o['kind']}/{o['metadata']['name']}"]
        if not pods:
            continue
        spec = o["spec"]["template"]["spec"]
        claim_ro = {v["name"]: bool(v["persistentVolumeClaim"].get("readOnly"))
                    for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
        sources = [(spec["containers"][0], pods[0].main)] + list(zip(spec.get("initContainers", []), pods[0].init,
                                                                     strict=True))
        for rendered_c, played in sources:
            mounts = {(m.target, m.sub_path): m for m in played.mounts}
            for m in rendered_c.get("volumeMounts", []):
                got = mounts.get((m["mountPath"], m.get("subPath", "")))
                assert got is not None, f"{o['metadata']['name']}: {m['mountPath']} not mounted"
                want_ro = bool(m.get("readOnly")) or claim_ro.get(m["name"], False)
                assert got.read_only == want_ro, f"{o['metadata']['name']}: {m['mountPath']} read-only {got.read_only}"
            assert len(mounts) == len(rendered_c.get("volumeMounts", []))


def test_every_rendered_object_is_played_or_listed_as_not_enforced(
        rendered: tuple[list[dict[str, Any]], dict[str, Any], Path], plan: Plan) -> None:
    objects = rendered[0]
    listed = "\n".join(plan.not_enforced + plan.not_played)
    played_workloads = {p.workload for p in plan.pods.values()}
    for o in objects:
        kind, name = o["kind"], o["metadata"]["name"]
        if f"{kind}/{name}" in played_workloads or (kind == "PersistentVolumeClaim" and name in plan.volumes):
            continue
        if kind == "Service" and any(f"{name}.{NS}.svc.cluster.local" in p.aliases for p in plan.pods.values()):
            continue
        if kind in ("ConfigMap", "Secret") and any(s.name == name for p in plan.pods.values()
                                                   for s in p.files.values()):
            continue
        assert f"{kind} {name}:" in listed, f"{kind} {name} is neither played nor listed as not enforced"
    controller = [o for o in objects if o["kind"] == "Deployment"
                  and o["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"]
    assert controller and f"Deployment {controller[0]['metadata']['name']}: not played" in listed


def test_downward_api_and_secret_env_are_filled_in(
        rendered: tuple[list[dict[str, Any]], dict[str, Any], Path], plan: Plan) -> None:
    objects = rendered[0]
    trainer = next(p for p in plan.pods.values() if p.labels.get("app.kubernetes.io/component") == "trainer")
    assert trainer.main.env["RLFLEET_POD_IP"] == trainer.ip
    assert trainer.main.env["RLFLEET_POD_INDEX"] == "0" and trainer.main.env["POD_NAME"] == trainer.name
    redis = next(p for p in plan.pods.values() if p.labels.get("app.kubernetes.io/component") == "redis")
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-redis"))
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert f">{password}" in redis.main.args and not any("$(" in a for a in redis.main.args)
    assert len({p.ip for p in plan.pods.values()}) == len(plan.pods)


def test_secret_files_are_projected_as_the_kubelet_does(plan: Plan, tmp_path: Path) -> None:
    buffer = next(p for p in plan.pods.values() if p.labels.get("app.kubernetes.io/component") == "buffer")
    for name in ("pki", "redis-auth"):
        write_volume(tmp_path / name, buffer.files[name], buffer.fs_group)
    key = (tmp_path / "pki" / "buffer.key").stat()
    assert (key.st_uid, key.st_gid, stat.S_IMODE(key.st_mode)) == (0, buffer.fs_group, 0o440)
    assert sorted(f.name for f in (tmp_path / "pki").iterdir()) == ["buffer.crt", "buffer.key", "ca.crt"]
    pw = (tmp_path / "redis-auth" / "password").stat()        # defaultMode 0400 + the fsGroup's read
    assert stat.S_IMODE(pw.st_mode) == 0o440


def test_a_secret_nobody_made_is_a_clear_error(rendered: tuple[list[dict[str, Any]], dict[str, Any], Path]) -> None:
    objects, _, secrets = rendered
    made = existing_secrets(secrets)
    del made["add1-buffer-tls"]
    with pytest.raises(PlanError, match="add1-buffer-tls is neither rendered nor made beforehand"):
        make_plan(objects, "add1", NS, made)


def test_scaling_replicas_by_re_render_changes_only_the_replicas(
        rendered: tuple[list[dict[str, Any]], dict[str, Any], Path]) -> None:
    """`helm upgrade --set rollout.replicas=N` (cert-manager's per-replica identities, played by the adapter's CA):
    the plan adds or removes rollout pods and leaves every other pod's template as it was (applying it restarts
    nothing else); a real config change (the learning rate) changes every service pod's template."""
    _, values, _ = rendered
    cm = {**values, "security": {**values["security"], "existingSecrets": None,
                                 "weightSigning": {"enabled": True, "existingSecret": ""}}}
    issuer = PlayIssuer()

    def plan_of(over: dict[str, Any]) -> Plan:
        return make_plan(render(merge(cm, over), release="add1", namespace=NS), "add1", NS, issuer=issuer)

    one = plan_of({"rollout": {"replicas": 1}})
    two = make_plan(render(merge(cm, {"rollout": {"replicas": 2}}), release="add1", namespace=NS), "add1", NS,
                    issuer=issuer, keep=one.kept_secrets, ips={n: p.ip for n, p in one.pods.items()})
    redis = next(n for n, p in one.pods.items() if p.labels["app.kubernetes.io/component"] == "redis")
    assert one.pods[redis].main.env["REDIS_PASSWORD"] == two.pods[redis].main.env["REDIS_PASSWORD"]   # lookup
    rollout = {n for n, p in two.pods.items() if p.labels["app.kubernetes.io/component"] == "rollout"}
    assert len(rollout) == 2 and set(two.pods) - set(one.pods) == rollout - set(one.pods)
    assert {n: p.template_hash for n, p in one.pods.items()} == {n: two.pods[n].template_hash for n in one.pods}
    trainer = next(n for n, p in one.pods.items() if p.labels["app.kubernetes.io/component"] == "trainer")
    assert one.pods[trainer].files["signing"] == two.pods[trainer].files["signing"]   # cert-manager keeps the key
    ids = {two.pods[n].main.args[-1] for n in rollout}
    assert ids == {f"--replica-id={n}" for n in rollout}          # each replica its own identity (its pod name)
    other = plan_of({"rollout": {"replicas": 1}, "runConfig": {"trainer": {"lr": 0.5}}})
    for name, pod in one.pods.items():
        if pod.labels["app.kubernetes.io/component"] != "redis":
            assert name not in other.pods or other.pods[name].template_hash != pod.template_hash, name
