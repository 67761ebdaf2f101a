"""Every image built for real and started (issue 39, item 1): docker/build.sh builds all seven with podman from the
local base and the lock's wheelhouse; each entrypoint answers --help as the non-root user on a read-only root; each
image's Python holds what its services import (and a hidden dependency is caught); the four CPU images install
their dependencies once (one shared layer); and the chart's Redis and four service pods, started as the rendered
chart runs them (command, args, env, user, fsGroup, read-only root, dropped capabilities, mounts; mTLS certificates
and the weight-signing key issued as cert-manager would, by a run CA of the test's own), pass the chart's probes
(docker/healthcheck.py for the services) against the live services, which refuse a client without a certificate.

Not checked here: CUDA itself (no GPU; the CUDA images are built with the CPU torch and checked up to their imports,
without SGLang's CUDA venv). The chart's Redis image (redis:7.2.5-bookworm) cannot be pulled here: its stand-in,
docker/stand-ins/redis.Dockerfile (Debian's redis-server 7.0), runs the chart's Redis pod."""

from __future__ import annotations

import base64
import ipaddress
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rlfleet.security.pki import create_ca, issue
from tests.cluster.chart import render
from tests.cluster.images_built import IMAGES, REDIS, REGISTRY, ROOT, TAG, build_images, podman, podman_many
from tests.cluster.pod_play import PodIdentity, Volume, podman_run_args, probe_command

pytestmark = pytest.mark.chart_play

CPU_SERVICES = ("rlfleet-buffer", "rlfleet-weight-sync", "rlfleet-trainer-cpu", "rlfleet-rollout-cpu")
# The pods started (Redis first: the buffer refuses to start without it, where a kubelet would restart it until then)
SERVICE_PODS = ("redis", "buffer", "weight-sync", "trainer", "rollout")
# What a kubelet gives a pod that the test reproduces: the run's user and group
FS_GROUP = 10001


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    return build_images()


def _container(image: str, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
    """A throwaway container as the chart runs one: uid 10001, read-only root, /tmp an empty tmpfs, no capabilities."""
    return ["run", "--rm", "--no-healthcheck", "--user", "10001:10001", "--read-only", "--read-only-tmpfs=false",
            "--tmpfs", "/tmp:rw,mode=1777,notmpcopyup", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            *extra, image, *args]


def _import_check(image: str, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
    mounts = ("-v", f"{ROOT / 'docker/import_check.py'}:/check/import_check.py:ro",
              "-v", f"{ROOT / 'pyproject.toml'}:/check/pyproject.toml:ro", "--entrypoint", "python")
    return _container(image, "/check/import_check.py", "--root", "/check", *args, extra=mounts + extra)


SITE = "/opt/rlfleet/lib/python3.11/site-packages"


@pytest.fixture(scope="module")
def checks(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompletedProcess[str]]:
    """Every container check below, run at once (each is mostly start-up and imports): check name -> its result."""
    empty = tmp_path_factory.mktemp("empty")
    # each image's entrypoint --help: its service's start-up imports
    commands = {f"help {name}": _container(images[name], "--help") for name in IMAGES}
    commands |= {
        # every module of rlfleet, and every name its files import, inside the image: the four CPU images share
        # trainer-cpu's install layer (test below), the two CUDA images trainer-cuda's
        "walk rlfleet-trainer-cpu": _import_check(images["rlfleet-trainer-cpu"], "--walk", "rlfleet"),
        "walk rlfleet-trainer-cuda": _import_check(images["rlfleet-trainer-cuda"], "--walk", "rlfleet"),
        "controller": _import_check(images["rlfleet-controller"], "--entry", "rlfleet.services.controller"),
        # the CUDA image's own extras, with the CPU torch: Megatron-core and NIXL's Python API import
        "cuda extras": _container(images["rlfleet-trainer-cuda"], "-c", "import megatron.core, nixl._api",
                                  extra=("--entrypoint", "python")),
        # one installed package hidden under an empty folder
        "hidden cryptography": _import_check(images["rlfleet-buffer"], "--entry", "rlfleet.services.buffer",
                                             "--walk", "rlfleet.security",
                                             extra=("-v", f"{empty}:{SITE}/cryptography:ro")),
    }
    return podman_many(commands, timeout=900)


def test_every_image_answers_help_as_its_user_on_a_read_only_root(checks: dict[str, CompletedProcess[str]]) -> None:
    for name, module in IMAGES.items():
        proc = checks[f"help {name}"]
        assert proc.returncode == 0, f"{name} --help exited {proc.returncode}: {proc.stderr[-2000:]}"
        assert f"usage: python -m rlfleet.services.{module}" in proc.stdout, proc.stdout[:500]


def test_the_cpu_images_install_their_dependencies_once(images: dict[str, str]) -> None:
    """Same instructions in the same order up to the install: the engine builds that layer once and the four share
    it (five images would otherwise each hold and build their own torch)."""
    install_layers = set()
    for name in CPU_SERVICES:
        history = podman("history", "--no-trunc", "--format", "{{.ID}}\t{{.Size}}\t{{.CreatedBy}}", images[name])
        layers = [line.split("\t") for line in history.stdout.splitlines() if "pip install" in line]
        assert len(layers) == 1, history.stdout
        install_layers.add(layers[0][0])
    assert len(install_layers) == 1, install_layers


@pytest.mark.parametrize("image", ["rlfleet-trainer-cpu", "rlfleet-trainer-cuda"])
def test_an_image_holds_everything_its_services_import(checks: dict[str, CompletedProcess[str]], image: str) -> None:
    proc = checks[f"walk {image}"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "import_check: ok (0 entry points, 1 packages walked)" in proc.stdout


def test_the_cuda_images_import_megatron_and_nixl(checks: dict[str, CompletedProcess[str]]) -> None:
    proc = checks["cuda extras"]
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_controller_image_starts_its_controller(checks: dict[str, CompletedProcess[str]]) -> None:
    proc = checks["controller"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_a_dependency_missing_from_an_image_is_caught(checks: dict[str, CompletedProcess[str]]) -> None:
    """The same check with one installed package hidden (an empty folder over it): the service dies at import, and
    the walk names the modules that need it."""
    proc = checks["hidden cryptography"]
    assert proc.returncode == 1, proc.stdout
    assert "python -m rlfleet.services.buffer --help exited 1" in proc.stdout
    assert "import rlfleet.security.pki: cannot import name 'x509' from 'cryptography'" in proc.stdout, proc.stdout


# ---- the four services as the chart runs them ----------------------------------------------------------------------

def _values() -> dict[str, Any]:
    return {"image": {"registry": REGISTRY, "tag": TAG, "variant": "cpu"},
            "redis": {"image": f"{REGISTRY}/{REDIS}:{TAG}"},
            "runConfig": {"run": {"name": "run"}, "model": {"path": "/models/model"},
                          "trainer": {"steps": 100000, "groups_per_step": 2, "checkpoint_every": 100000},
                          "rollout": {"group_size": 2, "claim_groups": 2, "max_batch_size": 8,
                                      "sampling": {"max_new_tokens": 4}}}}


def _write(path: Path, data: bytes, mode: int) -> None:
    """A file as the kubelet writes a read-only volume's (Secret, ConfigMap, csi-driver): root-owned, group the pod's
    fsGroup, the volume's mode with group read added (the kubelet's SetVolumeOwnership: mode | 0440 read-only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chown(path, 0, FS_GROUP)
    path.chmod(mode | 0o440)


class ChartPods:
    """The rendered chart's buffer, weight-sync, trainer and rollout pods, started on one podman network under the
    names their Services give them."""

    def __init__(self, objects: list[dict[str, Any]], base: Path) -> None:
        self.base = base
        self.run_id = uuid.uuid4().hex[:8]
        self.network = f"rlfleet-imgtest-{self.run_id}"
        self.objects = objects
        self.pods = {o["metadata"]["name"].split("-", 1)[1]: o["spec"]["template"]["spec"] for o in objects
                     if o["kind"] in ("Deployment", "StatefulSet")
                     and o["metadata"]["name"].split("-", 1)[1] in SERVICE_PODS}
        # a StatefulSet's claims: claim template name -> its folder (as the volume of the same name)
        self.claim_templates = {t["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"
                                for t in o["spec"].get("volumeClaimTemplates", [])}
        self.config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                                          and o["metadata"]["name"].endswith("-config"))["data"]["config.yaml"])
        self.containers: dict[str, str] = {}
        self.ca = create_ca()

    # -- what the cluster would provide -------------------------------------------------------------------------
    def _secret_data(self) -> dict[str, dict[str, bytes]]:
        """Secret name -> key -> bytes: the cert-manager Certificates issued by a run CA of our own, the signing key,
        and the chart's own Secrets."""
        data: dict[str, dict[str, bytes]] = {}
        for obj in self.objects:
            spec = obj.get("spec", {})
            if obj["kind"] == "Certificate" and not spec.get("isCA") and spec["uris"][0].startswith("spiffe://rlfleet/"):
                role, name = spec["uris"][0].removeprefix("spiffe://rlfleet/").split("/", 1)
                if name == "weights-signing":
                    key = Ed25519PrivateKey.generate()
                    data[spec["secretName"]] = {
                        "tls.key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()),
                        "tls.crt": key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo)}
                    continue
                if role not in ("trainer", "buffer", "weight_sync"):
                    continue
                issued = issue(self.ca, role, name, hosts=spec.get("dnsNames", []))
                data[spec["secretName"]] = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem,
                                            "ca.crt": self.ca.cert_pem}
            elif obj["kind"] == "Secret":
                data[obj["metadata"]["name"]] = {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
                data[obj["metadata"]["name"]].update({k: v.encode() for k, v in obj.get("stringData", {}).items()})
        return data

    def _volumes(self, pod: str, spec: dict[str, Any], identity: PodIdentity,
                 secrets: dict[str, dict[str, bytes]]) -> dict[str, Volume]:
        volumes: dict[str, Volume] = {}
        for claim in self.claim_templates:
            if any(m["name"] == claim for m in spec["containers"][0].get("volumeMounts", [])):
                folder = self.base / "pvc" / f"{claim}-{pod}-0"
                folder.mkdir(parents=True, exist_ok=True)
                os.chown(folder, FS_GROUP, FS_GROUP)
                volumes[claim] = Volume(folder)
        for vol in spec["volumes"]:
            folder = self.base / pod / vol["name"]
            if "emptyDir" in vol:
                volumes[vol["name"]] = Volume(None)
            elif "configMap" in vol:
                _write(folder / "config.yaml", yaml.safe_dump(self.config).encode(), 0o444)
                volumes[vol["name"]] = Volume(folder)
            elif "persistentVolumeClaim" in vol:
                volumes[vol["name"]] = Volume(self.base / "pvc" / vol["persistentVolumeClaim"]["claimName"])
            elif "secret" in vol:
                sec = vol["secret"]
                for item in sec["items"]:
                    _write(folder / item["path"], secrets[sec["secretName"]][item["key"]], sec["defaultMode"])
                volumes[vol["name"]] = Volume(folder)
            elif "csi" in vol:       # the rollout replica's own certificate, named for its pod (cert-manager csi)
                attrs = vol["csi"]["volumeAttributes"]
                hosts = attrs["csi.cert-manager.io/dns-names"].split(",")
                issued = issue(self.ca, "rollout", identity.name, hosts=hosts)
                mode = 0o440
                _write(folder / attrs["csi.cert-manager.io/certificate-file"], issued.cert_pem, mode)
                _write(folder / attrs["csi.cert-manager.io/privatekey-file"], issued.key_pem, mode)
                _write(folder / attrs["csi.cert-manager.io/ca-file"], self.ca.cert_pem, mode)
                volumes[vol["name"]] = Volume(folder)
            else:
                raise AssertionError(f"{pod}: volume {vol['name']} of a kind the test does not provide: {vol}")
        return volumes

    def _prepare_claims(self) -> None:
        from tests.support.tiny_model import make_tiny_model

        for obj in self.objects:
            if obj["kind"] == "PersistentVolumeClaim":
                (self.base / "pvc" / obj["metadata"]["name"]).mkdir(parents=True, exist_ok=True)
        model_claim = next(self.base / "pvc" / o["metadata"]["name"] for o in self.objects
                           if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"].endswith("-model"))
        make_tiny_model(model_claim / "model")
        data_claim = next(self.base / "pvc" / o["metadata"]["name"] for o in self.objects
                          if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"].endswith("-checkpoints"))
        checkpoints = data_claim / "runs" / self.config["run"]["name"] / "checkpoints"   # the replicas' subPath
        checkpoints.mkdir(parents=True)
        for path in [data_claim, *data_claim.rglob("*"), model_claim, *model_claim.rglob("*")]:
            os.chown(path, FS_GROUP, FS_GROUP)   # a fresh volume with the pod's fsGroup

    # -- start, probe, stop ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._prepare_claims()
        secrets = self._secret_data()
        secret_values = {(name, key): value.decode() for name, keys in secrets.items() for key, value in keys.items()}
        podman("network", "create", self.network)
        subnet = ipaddress.ip_network(podman("network", "inspect", self.network, "--format",
                                             "{{range .Subnets}}{{.Subnet}}{{end}}").stdout.strip())
        hosts = {"redis": [self.config["buffer"]["redis_url"].removeprefix("redis://").split("/")[0]],
                 "buffer": [self.config["endpoints"]["buffer"]],
                 "weight-sync": [self.config["endpoints"]["weight_sync"]],
                 "trainer": [self.config["endpoints"][k] for k in ("trainer", "trainer_data", "rendezvous")],
                 "rollout": list(self.config["endpoints"]["rollout"])}
        for i, pod in enumerate(SERVICE_PODS):
            spec = self.pods[pod]
            name = f"run-{pod}-0" if pod in ("trainer", "redis") else f"run-{pod}-{self.run_id}"
            identity = PodIdentity(name=name, index="0", ip=str(subnet.network_address + 10 + i))
            volumes = self._volumes(pod, spec, identity, secrets)
            container = spec["containers"][0]
            aliases = sorted({h.rsplit(":", 1)[0] for h in hosts[pod]})
            cname = f"rlfleet-imgtest-{pod}-{self.run_id}"
            args = ["run", "-d", "--no-healthcheck", "--name", cname, "--hostname", name, "--network", self.network,
                    "--ip", identity.ip, *[a for alias in aliases for a in ("--network-alias", alias)],
                    *podman_run_args(spec, container, volumes, identity, secret_values)]
            podman(*args)
            self.containers[pod] = cname
            if pod == "redis":
                failing = self.probe_until_ready(timeout=60)
                assert not failing, failing

    def probe_until_ready(self, timeout: float) -> dict[str, str]:
        """Run each pod's startup probe (podman exec, as the kubelet's exec probe) until it passes; pod -> '' when it
        passed, else the last failure or the container's log when it exited."""
        pending = {pod: "never probed" for pod in self.containers}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for pod in list(pending):
                cname, container = self.containers[pod], self.pods[pod]["containers"][0]
                probe = "startupProbe" if "startupProbe" in container else "readinessProbe"
                state = podman("inspect", "--format", "{{.State.Status}}", cname).stdout.strip()
                if state != "running":
                    pending[pod] = f"container {state}: {podman('logs', cname, check=False).stderr[-3000:]}"
                    deadline = 0
                    continue
                proc = podman("exec", cname, *probe_command(container, probe), check=False, timeout=60)
                if proc.returncode == 0:
                    del pending[pod]
                else:
                    pending[pod] = proc.stderr[-500:]
            time.sleep(2)
        return pending

    def stop(self) -> None:
        if self.containers:
            podman("rm", "-f", "-t", "2", *self.containers.values(), check=False)
        podman("network", "rm", "-f", self.network, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def chart_pods(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartPods]:
    pods = ChartPods(render(_values()), tmp_path_factory.mktemp("chart-pods"))
    try:
        pods.start()
        yield pods
    finally:
        pods.stop()


def test_the_services_start_as_the_chart_runs_them_and_pass_its_probes(chart_pods: ChartPods) -> None:
    failing = chart_pods.probe_until_ready(timeout=300)
    assert not failing, "\n".join(f"{pod}: {why}" for pod, why in failing.items())
    for pod, cname in chart_pods.containers.items():
        ids = podman("exec", cname, "id", "-u").stdout.strip()
        assert ids == "10001", (pod, ids)
        assert podman("exec", cname, "touch", "/written", check=False).returncode != 0, f"{pod}: root fs writable"
    # The probe can fail: against a port nothing serves, and (mTLS) without the pod's certificate
    ws = chart_pods.containers["weight-sync"]
    assert podman("exec", "-e", "RLFLEET_HEALTH_PORT=1", ws, "python", "/usr/local/bin/rlfleet-healthcheck",
                  check=False).returncode == 1
    assert podman("exec", "-e", "RLFLEET_PKI_DIR=", ws, "python", "/usr/local/bin/rlfleet-healthcheck",
                  check=False).returncode == 1
