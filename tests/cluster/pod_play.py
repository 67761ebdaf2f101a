"""One container of a rendered pod template, started with podman the way a kubelet would start it.

`podman_run_args` turns the container (command, args with $(VAR) expansion, env, securityContext, volumeMounts) and
its pod's securityContext into a `podman run` command line; the caller says where each volume's files are on the
host (`Volume`): what a ConfigMap, Secret or csi-driver volume would hold is a folder of files mounted read-only,
a PersistentVolumeClaim a folder, an emptyDir a tmpfs. Used by the image tests (tests/cluster/test_images_built.py);
probes run with `probe_command` through `podman exec`, as the kubelet's exec probes do.

What a kubelet does that this does not: resource limits, the seccomp profile (podman applies its own default, like
RuntimeDefault), service-account tokens (the chart turns them off), fieldRefs other than the pod's name, index and IP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Volume:
    """Where a pod volume's content is on the host: a folder (bind-mounted), or None for an emptyDir (a tmpfs)."""

    host_path: Path | None


@dataclass(frozen=True)
class PodIdentity:
    """What the downward API would give the container: metadata.name, the StatefulSet pod index, status.podIP."""

    name: str
    index: str = "0"
    ip: str = ""


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_FIELDS = {"metadata.name": "name", "status.podIP": "ip",
           "metadata.labels['apps.kubernetes.io/pod-index']": "index",
           "metadata.annotations['batch.kubernetes.io/job-completion-index']": "index"}


def container_env(container: dict[str, Any], pod: PodIdentity, secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment: values, the downward API fields above, and secretKeyRefs from `secrets`
    ((secret name, key) -> value). Anything else is an error: the test would otherwise run a pod the chart does not."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = _VAR.sub(lambda m: env.get(m[1], m[0]), str(entry["value"]))
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            env[entry["name"]] = getattr(pod, _FIELDS[source["fieldRef"]["fieldPath"]])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[entry["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            raise ValueError(f"env {entry['name']}: unsupported source {source}")
    return env


def podman_run_args(pod_spec: dict[str, Any], container: dict[str, Any], volumes: dict[str, Volume],
                    pod: PodIdentity, secrets: dict[tuple[str, str], str] | None = None) -> list[str]:
    """`podman run` arguments (after `podman run`, before any engine-level options the caller adds such as --name
    and --network) that start `container` of `pod_spec` as a kubelet would."""
    env = container_env(container, pod, secrets or {})
    pod_sc = pod_spec.get("securityContext", {})
    sc = container.get("securityContext", {})
    args = ["--user", f"{pod_sc['runAsUser']}:{pod_sc.get('runAsGroup', pod_sc['runAsUser'])}"]
    if "fsGroup" in pod_sc:
        args += ["--group-add", str(pod_sc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        # podman's --read-only would add tmpfs on /tmp, /var/tmp and /run by itself; a kubelet adds none
        args += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    for cap in sc.get("capabilities", {}).get("add", []):
        args += ["--cap-add", cap]
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if volume.host_path is None:
            # empty, as an emptyDir starts (podman would copy the image's folder in: tmpcopyup)
            args += ["--tmpfs", f"{mount['mountPath']}:rw,nosuid,nodev,mode=1777,notmpcopyup"]
            continue
        source = volume.host_path / mount.get("subPath", "")
        args += ["-v", f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
    for name, value in env.items():
        args += ["-e", f"{name}={value}"]
    command = [_VAR.sub(lambda m: env.get(m[1], m[0]), part) for part in container.get("command", [])]
    run_args = [_VAR.sub(lambda m: env.get(m[1], m[0]), part) for part in container.get("args", [])]
    if command:
        args += ["--entrypoint", command[0], container["image"], *command[1:], *run_args]
    else:
        args += [container["image"], *run_args]
    return args


def probe_command(container: dict[str, Any], probe: str = "startupProbe") -> list[str]:
    """The container's exec probe command (what `podman exec CONTAINER ...` runs)."""
    return list(container[probe]["exec"]["command"])
