"""A Plan played on podman, and a re-rendered Plan applied as a diff.

The kubelet's part, as far as one machine needs it: a network per release; each pod one container with its fixed
address, its Service DNS names as network aliases and its hostname; its ConfigMap/Secret volumes written under
WORK/pods/POD/ and bind-mounted read-only; PVCs as named volumes given the pod's fsGroup (group-owned, setgid, as
the kubelet's fsGroup change does), a subPath as a bind mount of that folder of the volume; emptyDir as a folder
WORK/pods/POD/emptydir/NAME made empty when the pod starts and kept across its container's restarts (a kill -9
restarts the container, not the pod: the kubelet keeps an emptyDir for the pod's life; a tmpfs would come back empty
and root-owned); init
containers run to completion first; restartPolicy Always as `restart_exited` (called by whoever watches the run);
readiness as the rendered readinessProbe (exec in the container, or TCP / HTTP to the pod's address).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.play.files import write_volume
from tests.cluster.play.plan import Container, Plan, Pod

LABEL = "io.rlfleet.play.release"
CONF = Path(__file__).resolve().parents[3] / "docker" / "podman" / "containers.conf"


class PodmanError(RuntimeError):
    pass


def engine_env() -> dict[str, str]:
    """podman's settings: CONTAINERS_CONF as given, else the repository's (docker/podman/containers.conf: runc, no
    default ulimits; docker/engine.sh sets the same)."""
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env and CONF.exists():
        env["CONTAINERS_CONF"] = str(CONF)
    return env


def podman(*args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env=engine_env())
    if check and proc.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:3])} ...: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def volume_path(name: str) -> Path:
    return Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", name).stdout.strip())


def _group_owned(path: Path, fs_group: int | None) -> None:
    if fs_group is not None:
        os.chown(path, 0, fs_group)
        os.chmod(path, 0o2775)


@dataclass
class Changes:
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


class Player:
    """What a release's objects are on this machine: its network, volumes and pod containers."""

    def __init__(self, work: Path) -> None:
        self.work = work

    # -- the whole release ------------------------------------------------------------------------------------
    def up(self, plan: Plan) -> list[str]:
        if podman("network", "exists", plan.network, check=False).returncode != 0:
            podman("network", "create", "--subnet", plan.subnet, "--label", f"{LABEL}={plan.release}", plan.network)
        for v in plan.volumes:
            self.ensure_volume(plan, v)
        # pods with init containers last: the others start meanwhile (a kubelet starts every pod at once)
        return [self.start(plan, pod) for pod in sorted(plan.pods.values(), key=lambda p: len(p.init))]

    def apply(self, current: Plan, new: Plan) -> Changes:
        """Make the played release what `new` renders: pods gone or changed (another template) are stopped
        gracefully and removed, new ones started; unchanged ones keep running. Volumes are never deleted (PVCs
        outlive pods)."""
        changes = Changes()
        for name, pod in current.pods.items():
            kept = new.pods.get(name)
            if kept is not None and kept.template_hash == pod.template_hash:
                changes.kept.append(name)
            else:
                self.delete(pod)
                changes.stopped.append(name)
        for v in new.volumes:
            self.ensure_volume(new, v)
        for name, pod in new.pods.items():
            if name not in changes.kept:
                changes.started.append(self.start(new, pod))
        return changes

    def down(self, plan: Plan, volumes: bool = True, logs: Path | None = None) -> None:
        names = podman("ps", "-a", "--filter", f"label={LABEL}={plan.release}", "--format", "{{.Names}}",
                       check=False).stdout.split()
        for name in names:
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                out = podman("logs", name, check=False)
                (logs / f"{name}.log").write_text(out.stdout + out.stderr)
            podman("rm", "-f", "-t", "5", name, check=False)
        podman("network", "rm", "-f", plan.network, check=False)
        if volumes:
            for v in plan.volumes:
                podman("volume", "rm", "-f", self.volume_name(plan, v), check=False)

    # -- volumes ----------------------------------------------------------------------------------------------
    @staticmethod
    def volume_name(plan: Plan, claim: str) -> str:
        return f"{plan.network}-{claim}"

    def ensure_volume(self, plan: Plan, claim: str) -> None:
        name = self.volume_name(plan, claim)
        if podman("volume", "exists", name, check=False).returncode != 0:
            podman("volume", "create", "--label", f"{LABEL}={plan.release}", name)

    # -- pods -------------------------------------------------------------------------------------------------
    def start(self, plan: Plan, pod: Pod) -> str:
        folder = self.work / "pods" / pod.name
        for vname, source in pod.files.items():
            write_volume(folder / vname, source, pod.fs_group)
        empty = folder / "emptydir"
        if empty.exists():
            shutil.rmtree(empty)                    # a new pod of the same name: its emptyDirs start empty
        for m in [m for c in (*pod.init, pod.main) for m in c.mounts if m.kind == "emptydir"]:
            (empty / m.source).mkdir(parents=True, exist_ok=True)
            os.chmod(empty / m.source, 0o1777)      # any uid of the pod may write, as in an emptyDir
        for c in pod.init:
            proc = podman(*self.run_args(plan, pod, c, init=True), timeout=1800.0, check=False)
            if proc.returncode != 0:
                raise PodmanError(f"pod {pod.name}: init container {c.name} exited {proc.returncode}: "
                                  f"{(proc.stdout + proc.stderr)[-3000:]}")
        podman(*self.run_args(plan, pod, pod.main, init=False))
        return pod.name

    def run_args(self, plan: Plan, pod: Pod, c: Container, init: bool) -> list[str]:
        name = f"{pod.name}-init-{c.name}" if init else pod.name
        args = ["run", "--rm" if init else "-d", "--name", name, "--hostname", pod.name, "--pull", "never",
                "--no-healthcheck",
                "--label", f"{LABEL}={plan.release}", "--label", f"io.rlfleet.play.hash={pod.template_hash}",
                "--network", plan.network, "--stop-timeout", str(pod.grace_s)]
        if not init:
            args += ["--ip", pod.ip, *[x for a in pod.aliases for x in ("--network-alias", a)]]
        if c.user is not None:
            args += ["--user", f"{c.user}:{c.group if c.group is not None else c.user}"]
        for g in c.groups:
            args += ["--group-add", str(g)]
        if c.read_only_root:
            args += ["--read-only", "--read-only-tmpfs=false"]
        args += [x for cap in c.cap_drop for x in ("--cap-drop", cap)]
        args += [x for cap in c.cap_add for x in ("--cap-add", cap)]
        if c.no_new_privileges:
            args += ["--security-opt", "no-new-privileges"]
        for k, v in c.env.items():
            args += ["--env", f"{k}={v}"]
        for m in c.mounts:
            ro = ",ro=true" if m.read_only else ""
            if m.kind == "emptydir":
                src = self.work / "pods" / pod.name / "emptydir" / m.source
                args += ["--mount", f"type=bind,src={src},dst={m.target}"]
            elif m.kind == "files":
                src = self.work / "pods" / pod.name / m.source / m.sub_path
                args += ["--mount", f"type=bind,src={src},dst={m.target}{ro}"]
            else:
                vname = self.volume_name(plan, m.source)
                root = volume_path(vname)
                _group_owned(root, pod.fs_group)
                if m.sub_path:
                    sub = root / m.sub_path
                    for p in [*reversed(sub.relative_to(root).parents), sub.relative_to(root)]:
                        if str(p) != "." and not (root / p).exists():
                            (root / p).mkdir()
                            _group_owned(root / p, pod.fs_group)
                    args += ["--mount", f"type=bind,src={sub},dst={m.target}{ro}"]
                else:
                    args += ["--mount", f"type=volume,src={vname},dst={m.target}{ro}"]
        args += ["--entrypoint", json.dumps(c.command), c.image, *c.args]
        return args

    def delete(self, pod: Pod) -> None:
        """The pod deleted: SIGTERM, its grace period, then SIGKILL; the container removed."""
        podman("stop", "-t", str(pod.grace_s), pod.name, check=False, timeout=pod.grace_s + 60.0)
        podman("rm", "-f", pod.name, check=False)

    def state(self, name: str) -> dict[str, Any]:
        proc = podman("inspect", "--format", "{{json .State}}", name, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def restart_exited(self, plan: Plan, finished_ok: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """restartPolicy Always: start again every pod container that exited (a kill -9, a crash), but those of
        `finished_ok` that exited 0 (a trainer that finished the run: judged on the same state read)."""
        restarted = []
        for pod in plan.pods.values():
            st = self.state(pod.name)
            if pod.name in finished_ok and st.get("Status") == "exited" and st.get("ExitCode") == 0:
                continue
            if st and not st.get("Running"):
                podman("start", pod.name)
                restarted.append(pod.name)
        return restarted

    def completed(self, pod: Pod) -> bool:
        """Its container ran to the end and exited 0 (a trainer that finished the run): nothing to wait for."""
        st = self.state(pod.name)
        return bool(st) and not st.get("Running") and st.get("ExitCode") == 0 and st.get("Status") == "exited"

    def kill(self, name: str, sig: str = "KILL") -> None:
        podman("kill", "-s", sig, name)

    def disconnect(self, plan: Plan, pod: Pod) -> None:
        podman("network", "disconnect", plan.network, pod.name)

    def reconnect(self, plan: Plan, pod: Pod) -> None:
        podman("network", "connect", "--ip", pod.ip, *[x for a in pod.aliases for x in ("--alias", a)],
               plan.network, pod.name)

    def logs(self, name: str, tail: int = 200) -> str:
        proc = podman("logs", "--tail", str(tail), name, check=False)
        return proc.stdout + proc.stderr

    # -- readiness --------------------------------------------------------------------------------------------
    def ready(self, pod: Pod) -> bool:
        probe = pod.main.ready
        if not self.state(pod.name).get("Running"):
            return False
        if probe is None:
            return True
        timeout = float(probe.get("timeoutSeconds", 1))
        if "exec" in probe:
            try:
                return podman("exec", pod.name, *probe["exec"]["command"], check=False,
                              timeout=timeout + 5).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        number = int((probe.get("tcpSocket") or probe.get("httpGet") or {}).get("port", 0))
        if "tcpSocket" in probe:
            try:
                socket.create_connection((pod.ip, number), timeout=timeout).close()
                return True
            except OSError:
                return False
        if "httpGet" in probe:
            try:
                with urllib.request.urlopen(f"http://{pod.ip}:{number}{probe['httpGet'].get('path', '/')}",
                                            timeout=timeout) as r:
                    return 200 <= r.status < 400
            except OSError:
                return False
        raise PodmanError(f"pod {pod.name}: readiness probe {sorted(probe)} is not played here")

    def wait_ready(self, pods: list[Pod], timeout: float, period: float = 2.0,
                   tick: Callable[[], object] | None = None) -> float:
        """Seconds until every pod answers its readiness probe; PodmanError naming the others after `timeout`.
        `tick` runs every period (e.g. restart_exited: the kubelet goes on meanwhile)."""
        start = time.monotonic()
        waiting = {p.name: p for p in pods}
        while waiting:
            if tick is not None:
                tick()
            for name in [n for n, p in waiting.items() if self.ready(p) or self.completed(p)]:
                del waiting[name]
            if not waiting:
                break
            if time.monotonic() - start > timeout:
                tails = "\n".join(f"--- {n}\n{self.logs(n, 30)}" for n in waiting)
                raise PodmanError(f"not ready after {timeout:.0f} s: {sorted(waiting)}\n{tails}")
            time.sleep(period)
        return time.monotonic() - start
