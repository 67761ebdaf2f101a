"""Every Dockerfile is hadolint-clean, non-root, on a pinned default base, with a HEALTHCHECK; the build script knows
them all and tags them the way the chart names them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.cluster.chart import render
from tests.cluster.tools import need_binary, need_module

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
# Images of others' software built here where theirs cannot be pulled (the chart's Redis)
STAND_INS = sorted((DOCKER / "stand-ins").glob("*.Dockerfile"))
LOCKS = DOCKER.parent / "locks"


def test_one_image_per_role_with_cpu_and_cuda_builds() -> None:
    names = {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES}
    assert names == {"buffer", "weight-sync", "controller", "trainer-cpu", "trainer-cuda", "rollout-cpu",
                     "rollout-cuda"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES + STAND_INS, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    hadolint = need_binary("hadolint")
    proc = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_non_root_pinned_with_healthcheck(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    # The base is a build argument (docker/build.sh passes a locally built one where no registry is reachable) whose
    # default is pinned; the wheelhouse stage is docker/build.sh's image of the lock's files
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    bases = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.M)
    assert bases[-1][0] == "${BASE}" and bases[:-1] == [("${WHEELS}", "wheels")], bases
    assert re.fullmatch(r"[\w./-]+:\d+(\.\d+)+[\w.-]*(@sha256:[0-9a-f]{64})?", args["BASE"]), args
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK\s+--interval", text, re.M)
    for line in re.findall(r"pip install[^\n]*", text):  # hadolint DL3013 checks the pins
        assert "--no-cache-dir" in line


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_image_installs_only_from_a_lock(dockerfile: Path) -> None:
    """Each pip install reads a committed lock (locks/*.txt), whole closure, every file checked against its hash:
    an image holds the versions .venv was tested with and nothing resolved on the day of the build."""
    text = dockerfile.read_text().replace("\\\n", " ")
    copied = set(re.findall(r"^COPY\s+(.*?)\s+/tmp/", text, re.M))
    locks = {Path(f).name for line in copied for f in line.split() if f.startswith("locks/")}
    assert locks, f"{dockerfile.name} copies no lock"
    for lock in locks:
        assert (LOCKS / lock).exists(), lock
    installs = re.findall(r"pip install ([^&\n]*)", text)
    assert installs
    for args in installs:
        assert "--require-hashes" in args and "--no-deps" in args, args
        requirement = re.search(r"-r /tmp/(\S+)", args)
        assert requirement is not None and Path(requirement[1]).name in locks, args


def test_build_script_tags_what_the_chart_pulls() -> None:
    need_module("helm_python")
    proc = subprocess.run(["bash", str(DOCKER / "build.sh")], env={"DRY_RUN": "1", "PATH": "/usr/bin:/bin",
                                                                   "REGISTRY": "reg.example/ml", "TAG": "9.9"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    built = set(re.findall(r"-t (\S+)", proc.stdout))
    assert len(built) == len(DOCKERFILES) + len(STAND_INS)
    for variant in ("cpu", "cuda"):
        objects = render({"image": {"registry": "reg.example/ml", "tag": "9.9", "variant": variant},
                          "spares": {"count": 1}})
        pulled = {c["image"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")
                  for c in o["spec"]["template"]["spec"]["containers"] if c["image"].startswith("reg.example/")}
        assert pulled and pulled <= built, pulled - built
