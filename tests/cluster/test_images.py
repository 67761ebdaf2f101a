"""Every Dockerfile is hadolint-clean, non-root, on a pinned base, with a HEALTHCHECK; the build script knows them
all and tags them the way the chart names them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cluster.chart import render
from tests.cluster.tools import need_binary, need_module

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def test_one_image_per_role_with_cpu_and_cuda_builds() -> None:
    names = {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES}
    assert names == {"buffer", "weight-sync", "controller", "trainer-cpu", "trainer-cuda", "rollout-cpu",
                     "rollout-cuda"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    hadolint = need_binary("hadolint")
    proc = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_non_root_pinned_with_healthcheck(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert bases and all(re.fullmatch(r"[\w./-]+:\d+(\.\d+)+[\w.-]*(@sha256:[0-9a-f]{64})?", b) for b in bases), bases
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK\s+--interval", text, re.M)
    for line in re.findall(r"pip install[^\n]*", text):  # hadolint DL3013 checks the pins
        assert "--no-cache-dir" in line


def test_requirement_files_are_pinned() -> None:
    for req in (DOCKER / "requirements").glob("*.txt"):
        for line in req.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                assert re.fullmatch(r"[A-Za-z][\w.-]*==[\w.]+", line), f"{req.name}: {line}"


def test_build_script_tags_what_the_chart_pulls() -> None:
    need_module("helm_python")
    proc = subprocess.run(["bash", str(DOCKER / "build.sh")], env={"DRY_RUN": "1", "PATH": "/usr/bin:/bin",
                                                                   "REGISTRY": "reg.example/ml", "TAG": "9.9"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    built = set(re.findall(r"-t (\S+)", proc.stdout))
    assert len(built) == len(DOCKERFILES)
    for variant in ("cpu", "cuda"):
        objects = render({"image": {"registry": "reg.example/ml", "tag": "9.9", "variant": variant},
                          "spares": {"count": 1}})
        pulled = {c["image"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")
                  for c in o["spec"]["template"]["spec"]["containers"] if c["image"].startswith("reg.example/")}
        assert pulled and pulled <= built, pulled - built
