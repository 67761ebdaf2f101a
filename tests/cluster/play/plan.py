"""Rendered Kubernetes objects -> a Plan of podman pods (pure: nothing here runs a command).

One container per pod (a Deployment's or StatefulSet's replica), on one network per release, with a fixed address
(so `status.podIP` is known before start) and a `--network-alias` for every DNS name a Service gives it: the
Service's short and qualified names, and for the headless Service a StatefulSet names, the per-pod names
`POD.SVC...`. Service ports must equal the container ports they target (an alias cannot remap a port).
ConfigMap and Secret volumes become files (written by files.py) bind-mounted read-only; PVCs and
volumeClaimTemplates become named podman volumes; emptyDir becomes a per-pod folder. Whatever has no podman
meaning is listed in `not_enforced`, one line per object or field: never silently dropped.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.play.issuer import CSI, PlayIssuer

NOT_PLAYED_KINDS = {
    "NetworkPolicy": "not enforced here (one flat podman network; a partition is `podman network disconnect`)",
    "PodDisruptionBudget": "not enforced here (no evictions: nothing drains a node)",
    "PriorityClass": "not enforced here (no scheduler, no preemption)",
    "ServiceMonitor": "not enforced here (no Prometheus operator)",
    "PrometheusRule": "not enforced here (no Prometheus operator; tests/cluster/test_alert_rules.py checks the rules)",
    "HorizontalPodAutoscaler": "not enforced here (no metrics adapter)",
    "ScaledObject": "not enforced here (no KEDA)",
    "Certificate": "not enforced here (no cert-manager: use security.existingSecrets)",
    "Issuer": "not enforced here (no cert-manager)",
    "ServiceAccount": "not enforced here (no API server)",
    "Role": "not enforced here (no API server)",
    "RoleBinding": "not enforced here (no API server)",
    "ClusterRole": "not enforced here (no API server)",
    "ClusterRoleBinding": "not enforced here (no API server)",
}
# pod-spec fields with no podman meaning here (listed per workload when present)
NOT_PLAYED_POD_FIELDS = {
    "affinity": "no scheduler: one machine", "topologySpreadConstraints": "no scheduler: one machine",
    "nodeSelector": "no scheduler: one machine", "tolerations": "no scheduler: one machine",
    "priorityClassName": "no scheduler, no preemption",
}
NOT_PLAYED_CONTAINER_FIELDS = {
    "resources": "no limits applied (2 shared cores)", "livenessProbe": "not run (nothing restarts a hung pod here)",
    "startupProbe": "not run (the readiness probe is waited for instead)",
}
WORKLOADS = ("Deployment", "StatefulSet")
PLAYED_KINDS = {*WORKLOADS, "Service", "ConfigMap", "Secret", "PersistentVolumeClaim"}


class PlanError(ValueError):
    """The rendered objects ask for something the adapter cannot play faithfully."""


@dataclass(frozen=True)
class FileSource:
    """A ConfigMap or Secret volume projected as files: path inside the volume -> (content, mode)."""
    kind: str                                   # ConfigMap | Secret
    name: str
    files: dict[str, tuple[bytes, int]]


@dataclass(frozen=True)
class Mount:
    target: str
    kind: str                                   # files | volume | emptydir
    source: str                                 # files: the volume's name in the pod; volume: podman volume name
    sub_path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: list[str]                          # the image's entry point replaced by this (k8s `command`)
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    user: int | None
    group: int | None
    groups: list[int]
    read_only_root: bool
    cap_drop: list[str]
    cap_add: list[str]
    no_new_privileges: bool
    ready: dict[str, Any] | None                # the readinessProbe as rendered (exec, tcpSocket or httpGet)


@dataclass(frozen=True)
class Pod:
    name: str
    workload: str                               # Kind/name of its owner
    index: int
    ip: str
    labels: dict[str, str]
    aliases: list[str]
    init: list[Container]
    main: Container
    files: dict[str, FileSource]                # pod volume name -> files
    fs_group: int | None
    grace_s: int
    template_hash: str                          # changes when the pod template changes (a rollout replaces the pod)


@dataclass
class Plan:
    release: str
    namespace: str
    network: str
    subnet: str
    pods: dict[str, Pod] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)       # podman volume names (PVCs, claim templates)
    not_enforced: list[str] = field(default_factory=list)
    not_played: list[str] = field(default_factory=list)    # workloads left out, with why
    kept_secrets: dict[str, dict[str, bytes]] = field(default_factory=dict)   # rendered Secrets as played


def _decode_secret(obj: dict[str, Any]) -> dict[str, bytes]:
    out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def existing_secrets(folder: Path | None) -> dict[str, dict[str, bytes]]:
    """Secrets made outside the chart: FOLDER/NAME/KEY files (what `kubectl create secret generic NAME
    --from-file=KEY=...` holds)."""
    if folder is None or not folder.is_dir():
        return {}
    return {d.name: {f.name: f.read_bytes() for f in sorted(d.iterdir()) if f.is_file()}
            for d in sorted(folder.iterdir()) if d.is_dir()}


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def dns_names(name: str, namespace: str) -> list[str]:
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values ($$ is a literal $; unknown stays as written)."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


class _Planner:
    def __init__(self, objects: list[dict[str, Any]], release: str, namespace: str,
                 secrets: dict[str, dict[str, bytes]], subnet: str, ips: dict[str, str],
                 issuer: PlayIssuer | None, keep: dict[str, dict[str, bytes]]) -> None:
        self.issuer = issuer
        self.objects = objects
        self.namespace = namespace
        self.ips = dict(ips)
        self.addresses = iter(str(a) for a in list(ipaddress.ip_network(subnet).hosts())[9:])   # .1: the gateway
        self.plan = Plan(release, namespace, f"rlfleet-play-{release}", subnet)
        self.configmaps = {o["metadata"]["name"]: {k: str(v).encode() for k, v in (o.get("data") or {}).items()}
                           for o in objects if o["kind"] == "ConfigMap"}
        self.secrets = dict(secrets)
        rendered = {o["metadata"]["name"]: _decode_secret(o) for o in objects if o["kind"] == "Secret"}
        # helm's `lookup` (the Redis password: kept on upgrade) has no cluster to read when rendering offline: a
        # Secret already played keeps its data, as the chart means it to
        rendered.update({k: v for k, v in keep.items() if k in rendered})
        self.secrets.update(rendered)
        self.plan.kept_secrets = rendered
        self.services = [o for o in objects if o["kind"] == "Service"]
        self.mounted: set[tuple[str, str]] = set()

    def run(self) -> Plan:
        for o in self.objects:
            kind, name = o["kind"], o["metadata"]["name"]
            if self.issuer is not None and kind in ("Certificate", "Issuer"):
                self.cert_manager(o)
            elif kind in NOT_PLAYED_KINDS:
                self.plan.not_enforced.append(f"{kind} {name}: {NOT_PLAYED_KINDS[kind]}")
            elif kind not in PLAYED_KINDS:
                self.plan.not_enforced.append(f"{kind} {name}: not enforced here (unknown to the adapter)")
            elif kind == "PersistentVolumeClaim":
                self.plan.volumes.append(name)
        for o in self.objects:
            if o["kind"] in WORKLOADS:
                self.workload(o)
        for kind, name in sorted((o["kind"], o["metadata"]["name"]) for o in self.objects
                                 if o["kind"] in ("ConfigMap", "Secret")):
            if (kind, name) not in self.mounted:
                self.plan.not_enforced.append(f"{kind} {name}: no played pod mounts it (kept as rendered)")
        for svc in self.services:
            self.check_service(svc)
        return self.plan

    def cert_manager(self, o: dict[str, Any]) -> None:
        assert self.issuer is not None
        kind, name = o["kind"], o["metadata"]["name"]
        data = self.issuer.certificate(o) if kind == "Certificate" else None
        if data is not None:
            self.secrets[o["spec"]["secretName"]] = data
        self.plan.not_enforced.append(f"{kind} {name}: cert-manager does not run here: the adapter's run CA "
                                      f"{'issued its Secret ' + o['spec']['secretName'] if data else 'stands in'}")

    def workload(self, o: dict[str, Any]) -> None:
        kind, name = o["kind"], o["metadata"]["name"]
        template = o["spec"]["template"]
        spec = template["spec"]
        if spec.get("automountServiceAccountToken") and spec.get("serviceAccountName"):
            self.plan.not_played.append(
                f"{kind} {name}: not played (it talks to the Kubernetes API through ServiceAccount "
                f"{spec['serviceAccountName']}; there is no API server here)")
            return
        for f, why in NOT_PLAYED_POD_FIELDS.items():
            if spec.get(f):
                self.plan.not_enforced.append(f"{kind} {name}: spec.{f}: not enforced here ({why})")
        for c in spec["containers"]:
            for f, why in NOT_PLAYED_CONTAINER_FIELDS.items():
                if c.get(f):
                    self.plan.not_enforced.append(f"{kind} {name}: container {c['name']}: {f}: {why}")
        if len(spec["containers"]) != 1:
            raise PlanError(f"{kind} {name}: {len(spec['containers'])} containers; the adapter plays one per pod")
        thash = _template_hash(template)
        claims = {t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates", [])}
        for i in range(int(o["spec"].get("replicas", 1))):
            pod = f"{name}-{i}" if kind == "StatefulSet" else f"{name}-{thash[:6]}-{i}"
            labels = dict(template["metadata"].get("labels", {}))
            if kind == "StatefulSet":
                labels.update({"apps.kubernetes.io/pod-index": str(i), "statefulset.kubernetes.io/pod-name": pod})
            for claim in sorted(claims):
                self.plan.volumes.append(f"{claim}-{pod}")
            self.plan.pods[pod] = self.pod(o, pod, i, labels, claims, thash)

    def pod(self, o: dict[str, Any], pod: str, index: int, labels: dict[str, str], claims: set[str],
            thash: str) -> Pod:
        spec = o["spec"]["template"]["spec"]
        ip = self.ips.get(pod) or next(a for a in self.addresses if a not in self.ips.values())
        aliases: list[str] = []
        for svc in self.services:
            if _selects(svc["spec"].get("selector", {}), labels):
                sname = svc["metadata"]["name"]
                aliases += dns_names(sname, self.namespace)
                if o["kind"] == "StatefulSet" and o["spec"].get("serviceName") == sname:
                    aliases += [f"{pod}.{a}" for a in dns_names(sname, self.namespace)]
        sec = spec.get("securityContext", {})
        files: dict[str, FileSource] = {}
        volumes: dict[str, tuple[str, str, bool]] = {}       # pod volume -> (kind, source, read only)
        for v in spec.get("volumes", []):
            volumes[v["name"]] = self.volume(o, v, files, pod)
        for claim in claims:
            volumes[claim] = ("volume", f"{claim}-{pod}", False)
        fields = {"metadata.name": pod, "metadata.namespace": self.namespace, "status.podIP": ip,
                  **{f"metadata.labels['{k}']": v for k, v in labels.items()}}
        init = [self.container(o, c, sec, volumes, fields) for c in spec.get("initContainers", [])]
        main = self.container(o, spec["containers"][0], sec, volumes, fields)
        return Pod(pod, f"{o['kind']}/{o['metadata']['name']}", index, ip, labels, sorted(set(aliases)), init, main,
                   files, sec.get("fsGroup"), int(spec.get("terminationGracePeriodSeconds", 30)), thash)

    def volume(self, o: dict[str, Any], v: dict[str, Any], files: dict[str, FileSource],
               pod: str) -> tuple[str, str, bool]:
        where = f"{o['kind']} {o['metadata']['name']}: volume {v['name']}"
        if v.get("csi", {}).get("driver") == CSI and self.issuer is not None:
            issued = self.issuer.csi_files(v["csi"].get("volumeAttributes", {}), pod, where)
            files[v["name"]] = FileSource("CSI", f"{CSI} for {pod}", {k: (d, 0o440) for k, d in issued.items()})
            return ("files", v["name"], True)
        if "configMap" in v or "secret" in v:
            kind = "ConfigMap" if "configMap" in v else "Secret"
            ref = v.get("configMap") or v.get("secret") or {}
            name = str(ref.get("name") or ref.get("secretName"))
            store = self.configmaps if kind == "ConfigMap" else self.secrets
            if name not in store:
                raise PlanError(f"{where}: {kind} {name} is neither rendered nor made beforehand")
            self.mounted.add((kind, name))
            data, mode = store[name], int(ref.get("defaultMode", 0o644))
            items = ref.get("items") or [{"key": k, "path": k} for k in sorted(data)]
            missing = [i["key"] for i in items if i["key"] not in data]
            if missing:
                raise PlanError(f"{where}: {kind} {name} has no key(s) {missing}")
            files[v["name"]] = FileSource(kind, name, {i["path"]: (data[i["key"]], int(i.get("mode", mode)))
                                                       for i in items})
            return ("files", v["name"], True)
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]
            if claim["claimName"] not in self.plan.volumes:
                raise PlanError(f"{where}: PVC {claim['claimName']} is not rendered (existingClaim: make the "
                                f"podman volume yourself)")
            return ("volume", claim["claimName"], bool(claim.get("readOnly")))
        if "emptyDir" in v:
            return ("emptydir", v["name"], False)
        raise PlanError(f"{where}: {sorted(set(v) - {'name'})} volumes are not played here")

    def container(self, o: dict[str, Any], c: dict[str, Any], pod_sec: dict[str, Any],
                  volumes: dict[str, tuple[str, str, bool]], fields: dict[str, str]) -> Container:
        where = f"{o['kind']} {o['metadata']['name']}: container {c['name']}"
        env: dict[str, str] = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
                continue
            src = e.get("valueFrom", {})
            if "secretKeyRef" in src or "configMapKeyRef" in src:
                ref = src.get("secretKeyRef") or src["configMapKeyRef"]
                store = self.secrets if "secretKeyRef" in src else self.configmaps
                kind = "Secret" if "secretKeyRef" in src else "ConfigMap"
                if ref["key"] not in store.get(ref["name"], {}):
                    raise PlanError(f"{where}: env {e['name']}: {kind} {ref['name']} key {ref['key']} not found")
                self.mounted.add((kind, ref["name"]))
                env[e["name"]] = store[ref["name"]][ref["key"]].decode()
            elif "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise PlanError(f"{where}: env {e['name']}: fieldRef {path} is not played here")
                env[e["name"]] = fields[path]
            else:
                raise PlanError(f"{where}: env {e['name']}: {sorted(src)} is not played here")
        if c.get("envFrom"):
            raise PlanError(f"{where}: envFrom is not played here")
        if not c.get("command"):
            raise PlanError(f"{where}: no command (the image's entry point is not read here)")
        command = [expand(str(x), env) for x in c["command"]]
        args = [expand(str(x), env) for x in c.get("args", [])]
        mounts = []
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                raise PlanError(f"{where}: mount {m['mountPath']}: no volume {m['name']}")
            kind, source, ro = volumes[m["name"]]
            mounts.append(Mount(m["mountPath"], kind, source, m.get("subPath", ""), ro or bool(m.get("readOnly"))))
        sec = {**pod_sec, **c.get("securityContext", {})}
        caps = sec.get("capabilities", {})
        user = sec.get("runAsUser")
        if sec.get("runAsNonRoot") and user in (None, 0):
            raise PlanError(f"{where}: runAsNonRoot without a non-zero runAsUser")
        groups = [g for g in [pod_sec.get("fsGroup"), *pod_sec.get("supplementalGroups", [])] if g is not None]
        return Container(c["name"], c["image"], command, args, env, mounts, user, sec.get("runAsGroup"), groups,
                         bool(sec.get("readOnlyRootFilesystem")), list(caps.get("drop", [])),
                         list(caps.get("add", [])), sec.get("allowPrivilegeEscalation") is False,
                         _numbered(c.get("readinessProbe"), c))

    def check_service(self, svc: dict[str, Any]) -> None:
        name = svc["metadata"]["name"]
        selector = svc["spec"].get("selector", {})
        pods = [p for p in self.plan.pods.values() if _selects(selector, p.labels)]
        if not pods:
            self.plan.not_enforced.append(f"Service {name}: selects no played pod")
            return
        for pod in pods:
            ports = {p["name"]: p["containerPort"] for p in self._container_ports(pod)}
            for port in svc["spec"].get("ports", []):
                target = port.get("targetPort", port["port"])
                number = ports.get(target) if isinstance(target, str) else target
                if number != port["port"]:
                    raise PlanError(f"Service {name}: port {port['port']} targets {target} ({number}) in pod "
                                    f"{pod.name}: a network alias cannot remap ports")

    def _container_ports(self, pod: Pod) -> list[dict[str, Any]]:
        kind, name = pod.workload.split("/", 1)
        o = next(x for x in self.objects if x["kind"] == kind and x["metadata"]["name"] == name)
        return list(o["spec"]["template"]["spec"]["containers"][0].get("ports", []))


def _numbered(probe: dict[str, Any] | None, c: dict[str, Any]) -> dict[str, Any] | None:
    """The probe with a named port (tcpSocket / httpGet) replaced by the container's number for it."""
    if probe is None:
        return None
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    out = dict(probe)
    for key in ("tcpSocket", "httpGet"):
        if key in out and isinstance(out[key].get("port"), str):
            out[key] = {**out[key], "port": ports[out[key]["port"]]}
    return out


def make_plan(objects: list[dict[str, Any]], release: str, namespace: str,
              secrets: dict[str, dict[str, bytes]] | None = None, subnet: str = "10.89.77.0/24",
              ips: dict[str, str] | None = None, issuer: PlayIssuer | None = None,
              keep: dict[str, dict[str, bytes]] | None = None) -> Plan:
    """The pods, volumes and not-enforced list of a rendered release; `secrets`: Secrets made beforehand
    (existing_secrets); `ips`: addresses of pods already played (kept; new pods get free ones); `issuer`: plays
    cert-manager's Certificates and csi-driver volumes (without it they are refused or listed as not enforced);
    `keep`: the rendered Secrets as already played (a re-render keeps their data, as helm's lookup would)."""
    return _Planner(objects, release, namespace, secrets or {}, subnet, ips or {}, issuer, keep or {}).run()
