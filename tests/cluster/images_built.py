"""The images as docker/build.sh builds them with podman, and podman itself as the repository sets it up.

`build_images()` runs docker/build.sh (all seven images; the CUDA ones with the CPU torch, docker/cpu_torch_lock.py)
and returns each image's reference; a second call, or one on a machine that built them before, reuses the cached
base, wheelhouse and layers (seconds). `podman(...)` runs podman with docker/podman/containers.conf. Shared by the
image tests and the chart play.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.cluster.tools import need_binary

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "docker" / "podman" / "containers.conf"
REGISTRY = "localhost"
TAG = re.search(r'^appVersion:\s*"?([^"\n]+)"?$', (ROOT / "deploy/helm/rlfleet/Chart.yaml").read_text(), re.M)[1]  # type: ignore[index]
# image name -> the service module its entrypoint runs
IMAGES = {"rlfleet-buffer": "buffer", "rlfleet-weight-sync": "weight_sync", "rlfleet-trainer-cpu": "trainer",
          "rlfleet-rollout-cpu": "rollout", "rlfleet-controller": "controller", "rlfleet-trainer-cuda": "trainer",
          "rlfleet-rollout-cuda": "rollout"}
REDIS = "rlfleet-redis"   # docker/stand-ins/redis.Dockerfile: the chart's redis.image where it cannot be pulled


def engine_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([need_binary("podman"), *args], capture_output=True, text=True, timeout=timeout,
                          env=engine_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} ... exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc


def podman_many(commands: dict[str, list[str]], timeout: float) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run podman commands at once (containers spend most of their time starting and importing); name -> result."""
    binary = need_binary("podman")
    procs = {name: subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=engine_env()) for name, args in commands.items()}
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def build_images(timeout: float = 2400) -> dict[str, str]:
    """Build (or reuse) every image; image name (IMAGES and REDIS) -> reference."""
    need_binary("podman")
    need_binary("debootstrap")
    proc = subprocess.run(["bash", str(ROOT / "docker/build.sh"), "--engine", "podman", "--base", "local",
                           "--cuda-torch", "cpu"], capture_output=True, text=True, timeout=timeout,
                          env={**engine_env(), "REGISTRY": REGISTRY, "TAG": TAG, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {name: f"{REGISTRY}/{name}:{TAG}" for name in (*IMAGES, REDIS)}
