"""The chart's side doors: Redis behind an ACL user whose password only the buffer pod mounts, reachable from the
buffer alone; trainer ports from trainer ranks and replicas only; checkpoints writable by trainer pods only.
The rendered Redis command line is run as a real redis-server to show what it refuses."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from rlfleet.security.bound_store import POD_IP_ENV
from rlfleet.security.scrub import redis_url_with_credentials
from rlfleet.services.buffer.stores.redis_streams import RedisStore
from tests.cluster.chart import (
    WORKLOAD_KINDS,
    all_pod_specs,
    by_kind,
    component,
    merge,
    pod_spec,
    render,
    scenario_values,
)
from tests.cluster.tools import need_module
from tests.support.redis_server import free_port

RUN = {"app.kubernetes.io/name": "rlfleet", "app.kubernetes.io/instance": "run1"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    need_module("helm_python")
    return render()


def _component(labels: dict) -> str | None:
    return labels.get("app.kubernetes.io/component")


def test_redis_password_is_mounted_in_the_buffer_pod_only(objects: list[dict]) -> None:
    secret = next(s for s in by_kind(objects, "Secret") if s["metadata"]["name"] == "run1-redis")
    assert secret["data"]["password"]
    users = []
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        for spec in all_pod_specs(obj):
            vols = [v for v in spec.get("volumes", []) if v.get("secret", {}).get("secretName") == "run1-redis"]
            envs = [e for c in spec["containers"] for e in c.get("env", [])
                    if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "run1-redis"]
            if vols or envs:
                users.append((obj["metadata"]["name"], bool(vols), bool(envs)))
    assert sorted(users) == [("run1-buffer", True, False), ("run1-redis", False, True)]
    with_existing = render({"redis": {"auth": {"existingSecret": "gitops-redis"}}})
    assert not [s for s in by_kind(with_existing, "Secret") if s["metadata"]["name"] == "run1-redis"]
    buffer = pod_spec(component(with_existing, "Deployment", "buffer"))
    assert any(v.get("secret", {}).get("secretName") == "gitops-redis" for v in buffer["volumes"])


def test_network_policies_close_redis_and_the_trainer_ports(objects: list[dict]) -> None:
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    redis_pol = policies["run1-redis-ingress"]
    assert redis_pol["podSelector"]["matchLabels"] == {**RUN, "app.kubernetes.io/component": "redis"}
    assert redis_pol["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        **RUN, "app.kubernetes.io/component": "buffer"}}}], "ports": [{"port": 6379, "protocol": "TCP"}]}]
    open_ingress = policies["run1-in-run-ingress"]
    assert {"key": "app.kubernetes.io/component", "operator": "NotIn",
            "values": ["redis", "trainer"]} in open_ingress["podSelector"]["matchExpressions"]
    trainer = policies["run1-trainer-ingress"]["ingress"]
    peers = [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in trainer[0]["from"]]
    assert sorted(peers) == ["rollout", "trainer"] and "ports" not in trainer[0]
    assert trainer[1]["from"] == [{"podSelector": {"matchLabels": RUN}}]
    assert trainer[1]["ports"] == [{"port": 50053, "protocol": "TCP"}]
    known = {"run1-in-run-ingress", "run1-default-deny", "run1-in-run", "run1-scrape", "run1-redis-ingress",
             "run1-trainer-ingress", "run1-controller-api"}
    assert set(policies) <= known, set(policies) - known       # no other policy opens a port


def _claims(spec: dict, container: dict) -> dict[str, tuple[str, bool]]:
    """claimName -> (mountPath, read-only) of every PVC a container mounts."""
    vols = {v["name"]: v["persistentVolumeClaim"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
    return {vols[m["name"]]["claimName"]: (m["mountPath"], bool(m.get("readOnly") or vols[m["name"]].get("readOnly")))
            for m in container.get("volumeMounts", []) if m["name"] in vols}


@pytest.mark.parametrize("scenario", ["cpu-minimal", "gpu-64gpus-2racks", "cpu-disk-delta"])
def test_only_trainer_pods_mount_the_checkpoint_volume_and_deltas_have_their_own(scenario: str) -> None:
    need_module("helm_python")
    values = (scenario_values("cpu-minimal") if scenario == "cpu-disk-delta" else scenario_values(scenario))
    if scenario == "cpu-disk-delta":
        values = merge(values, {"runConfig": {"weight_sync": {"transport": "disk_delta"}}})
    objects = render(values)
    config = next(c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"] == "run1-config")
    delta_dir = (yaml.safe_load(config["data"]["config.yaml"]).get("weight_sync") or {}).get("delta_dir")
    uses_deltas = values["runConfig"]["weight_sync"]["transport"] in ("disk_delta", "auto")
    seen: dict[str, int] = {}
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        comp = _component(obj["metadata"]["labels"])
        for spec in all_pod_specs(obj):
            for c in spec["containers"] + spec.get("initContainers", []):
                claims = _claims(spec, c)
                if comp == "trainer":
                    assert claims.get("run1-checkpoints", ("", True))[1] is False, obj["metadata"]["name"]
                else:
                    assert "run1-checkpoints" not in claims, (obj["metadata"]["name"], c["name"])
                if "run1-deltas" in claims:
                    path, read_only = claims["run1-deltas"]
                    assert path == delta_dir and read_only is (comp != "trainer"), (comp, claims)
                    assert comp in ("trainer", "rollout")
                    seen[str(comp)] = seen.get(str(comp), 0) + 1
                    assert path not in {p for k, (p, _) in claims.items() if k != "run1-deltas"}
    pvcs = {p["metadata"]["name"] for p in by_kind(objects, "PersistentVolumeClaim")}
    if uses_deltas:
        assert delta_dir and seen.get("trainer") and seen.get("rollout") and "run1-deltas" in pvcs
    else:
        assert not seen and "run1-deltas" not in pvcs and not delta_dir
    assert "run1-checkpoints" in pvcs


def test_rendered_redis_refuses_everyone_but_the_buffer_user(objects: list[dict], tmp_path: Path) -> None:
    c = pod_spec(component(objects, "StatefulSet", "redis"))["containers"][0]
    assert "--protected-mode" not in c["args"]
    password = "s3cret-from-the-secret"
    port = free_port()
    args = [a.replace("$(REDIS_PASSWORD)", password) for a in c["args"]]
    args[args.index("--dir") + 1] = str(tmp_path)
    args[args.index("--port") + 1] = str(port)
    proc = subprocess.Popen(["redis-server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        anon = redis.Redis(port=port, socket_timeout=5)
        for _ in range(100):
            try:
                assert anon.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        with pytest.raises(redis.exceptions.NoPermissionError):
            anon.xadd("rlfleet:run:buffer:log", {"x": "1"})                    # raw XADD around Buffer.Put
        (tmp_path / "password").write_text(password + "\n")
        url = redis_url_with_credentials(f"redis://127.0.0.1:{port}/0", "buffer", str(tmp_path / "password"))
        assert password in url
        store = RedisStore(url, prefix="rlfleet:run:buffer")
        assert store.load() is not None                                         # the buffer's user works
        # ... and reads appendfsync, so the buffer's durability check is strict in the chart too (not INFO's guess)
        assert redis.Redis.from_url(url, socket_timeout=5).config_get("appendfsync") == {"appendfsync": "always"}
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(url.replace(password, "guess"), socket_timeout=5).ping()
        store.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_weaker_redis_fsync_renders_only_when_the_run_config_accepts_it_by_name() -> None:
    need_module("helm_python")
    with pytest.raises(Exception, match="runConfig.buffer.redis_durability: everysec_loses_1s"):
        render({"redis": {"appendfsync": "everysec"}})
    with pytest.raises(Exception, match="runConfig.buffer.redis_durability: unchecked_may_lose_writes"):
        render({"redis": {"appendfsync": "no"}})
    accepted = render({"redis": {"appendfsync": "everysec"},
                       "runConfig": {"buffer": {"redis_durability": "everysec_loses_1s"}}})
    args = pod_spec(component(accepted, "StatefulSet", "redis"))["containers"][0]["args"]
    assert args[args.index("--appendfsync") + 1] == "everysec"


def test_trainer_ranks_are_given_their_pod_ip_to_bind_the_rendezvous_store_to(objects: list[dict]) -> None:
    """torch's TCPStore master listens on every interface; rank 0 binds RLFLEET_POD_IP (the downward API's
    status.podIP) instead when the rendezvous name does not resolve to this pod yet
    (rlfleet/security/bound_store.py)."""
    trainer = component(objects, "StatefulSet", "trainer")
    env = {e["name"]: e for e in pod_spec(trainer)["containers"][0]["env"]}
    assert env[POD_IP_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
