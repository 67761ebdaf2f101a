"""The project's locks: one table of what each environment holds, and the commands that refresh, check and verify them.

Every environment rlfleet's two commands build, and every image, installs from a committed, hashed lock in `locks/`
(`pip install --no-deps --require-hashes`), so a green run on one machine is green on a fresh one next month. The
user-facing `pip install rlfleet` keeps the ranges in pyproject.toml; the locks pin one tested point inside them.

    python scripts/locks.py refresh [--upgrade | --upgrade-package NAME ...]
        re-resolve every lock with uv (keeping each pin unless asked to upgrade it), then rebuild .venv from the new
        lock and regenerate what the pins decide (gRPC stubs, config docs); prints what changed
    python scripts/locks.py check
        offline: every lock satisfies its inputs (a dependency added to pyproject.toml without a refresh fails here),
        the locks agree with each other on every shared package, and the generated stubs need no newer runtime than
        pyproject.toml admits
    VENV/bin/python scripts/locks.py verify LOCK [--subset]
        the running interpreter's environment holds exactly LOCK's pins (--subset: nothing outside them); stdlib only,
        so it runs in any venv, half-made ones included

docs/dependencies.md says when to use which and how a refresh is reviewed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
PYTHON_VERSION = "3.11"                      # the machines the locks are for: CPython 3.11 on x86_64 Linux
PLATFORM = "x86_64-manylinux_2_36"   # glibc 2.36: Debian bookworm, here and in the images
FIND_LINKS = "/opt/wheels"                   # where this machine kind keeps the CPU torch wheel (torch==2.13.0+cpu)
INSTALLER_ONLY = {"pip"}                     # in every venv, never in a lock: it does the installing
BUNDLED = {"setuptools"}                     # `python3.11 -m venv` puts it there: checked only where a lock pins it


@dataclass(frozen=True)
class Lock:
    """One locked environment: what it is resolved from, and which other lock decides the versions it shares."""

    name: str                                # locks/<name>.txt
    purpose: str
    inputs: tuple[str, ...]                  # requirement files or pyproject.toml, relative to the root
    extras: tuple[str, ...] = ()             # pyproject.toml extras
    constrained_by: str | None = None        # a lock whose pins this one must reuse (same version everywhere)
    own: tuple[str, ...] = ()                # packages this lock resolves for itself even so (a CUDA torch)
    no_deps: bool = False                    # the inputs are already a complete closure (pinned by hand)
    find_links: bool = True

    @property
    def path(self) -> Path:
        return LOCKS / f"{self.name}.txt"


# Order matters: a lock comes after the lock it is constrained by.
ALL_LOCKS: tuple[Lock, ...] = (
    Lock("dev", ".venv for `dev.sh test`: the project, its test extra and every test tool",
         ("pyproject.toml", "locks/dev.in"), extras=("test",)),
    Lock("runtime", ".venv for `dev.sh run`, and the CPU service images: the project's dependencies",
         ("pyproject.toml", "locks/runtime.in"), constrained_by="dev"),
    Lock("controller", "the controller image: the Kubernetes client and the SDK's config, gRPC and metrics",
         ("locks/controller.in",), constrained_by="dev"),
    Lock("image-cuda", "the CUDA trainer and rollout images: the runtime lock with PyPI's CUDA torch, Megatron-core "
         "and NIXL", ("pyproject.toml", "locks/image-cuda.in"), constrained_by="dev", own=("torch",), find_links=False),
    Lock("sglang-cuda", "the rollout-cuda image's SGLang venv (/opt/sglang): SGLang 0.5.23 with its own CUDA torch",
         ("locks/sglang-cuda.in",), find_links=False),
    Lock("sglang-cpu", ".venv-sglang: SGLang 0.5.23 on CPU beside torch 2.13.0 (a closure pinned by hand, --no-deps)",
         ("locks/sglang-cpu.in",), no_deps=True),
    Lock("trl-bench", ".venv-trl: TRL's GRPOTrainer for bench/vs_trl.py (a baseline, never a dependency)",
         ("locks/trl-bench.in",)),
)
BY_NAME = {lock.name: lock for lock in ALL_LOCKS}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def normalize(name: str) -> str:
    """PEP 503 name normalization: `Foo_Bar.baz` and `foo-bar-baz` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a lock (hash and comment lines skipped)."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            pins[normalize(match[1])] = match[2]
    return pins


def unhashed(lock: Path) -> list[str]:
    """Pins of a lock not followed by a `--hash=` line."""
    lines = lock.read_text().splitlines()
    return [normalize(m[1]) for i, line in enumerate(lines) if (m := _PIN.match(line))
            and not (i + 1 < len(lines) and lines[i + 1].strip().startswith("--hash="))]


# --- verify: the running environment against a lock (stdlib only) --------------------------------------------------

def installed() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[normalize(name)] = dist.version
    return found


def compare(pins: dict[str, str], have: dict[str, str], lock_name: str, subset: bool,
            project: str | None) -> list[str]:
    """What differs between installed distributions (`have`) and a lock's pins; empty when they agree."""
    problems = []
    for name, version in sorted(have.items()):
        if name in INSTALLER_ONLY or name == project or (name in BUNDLED and name not in pins):
            continue
        if name not in pins:
            problems.append(f"{name}=={version} is installed but not in {lock_name}")
        elif pins[name] != version:
            problems.append(f"{name}=={version} is installed, {lock_name} pins {pins[name]}")
    if not subset:
        problems += [f"{name}=={pins[name]} is in {lock_name} but not installed" for name in sorted(pins)
                     if name not in have]
    if project is not None and project not in have:
        problems.append(f"the project ({project}) is not installed")
    return problems


def verify(lock: Path, subset: bool, project: str | None) -> list[str]:
    """This interpreter's environment against a lock."""
    want_python = tuple(int(p) for p in PYTHON_VERSION.split("."))
    if sys.version_info[:2] != want_python:
        return [f"Python {sys.version_info.major}.{sys.version_info.minor}, the locks are for {PYTHON_VERSION}"]
    return compare(read_pins(lock), installed(), lock.name, subset, project)


# --- check: the locks against their inputs and each other (offline) -------------------------------------------------

def _requirements_of(lock: Lock, root: Path) -> list[str]:
    """The requirement strings a lock was resolved from (pyproject's dependencies and extras, and the .in files)."""
    import tomllib

    reqs: list[str] = []
    for item in lock.inputs:
        path = root / item
        if path.name == "pyproject.toml":
            project = tomllib.loads(path.read_text())["project"]
            reqs += project["dependencies"]
            for extra in lock.extras:
                reqs += project["optional-dependencies"][extra]
            continue
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                reqs.append(line)
    return reqs


def check(root: Path = ROOT) -> list[str]:
    """Offline: every lock satisfies its inputs and agrees with the lock it is constrained by, and pyproject.toml's
    floors admit the committed stubs."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems: list[str] = []
    pins_of = {}
    for lock in ALL_LOCKS:
        path = root / "locks" / lock.path.name
        if not path.exists():
            problems.append(f"locks/{path.name} is missing: run python scripts/locks.py refresh")
            continue
        pins = pins_of[lock.name] = read_pins(path)
        problems += [f"{lock.name}: {name} has no --hash (every file must be checked at install)"
                     for name in unhashed(path)]
        for text in _requirements_of(lock, root):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"python_version": PYTHON_VERSION,
                                                                     "sys_platform": "linux"}):
                continue
            name = normalize(req.name)
            if name not in pins:
                problems.append(f"{lock.name}: {text!r} is asked for but not locked: run python scripts/locks.py "
                                f"refresh")
            elif not req.specifier.contains(Version(pins[name]), prereleases=True):
                problems.append(f"{lock.name}: {name}=={pins[name]} does not satisfy {text!r}: run python "
                                f"scripts/locks.py refresh")
        if lock.constrained_by and lock.constrained_by in pins_of:
            base = pins_of[lock.constrained_by]
            problems += [f"{lock.name} pins {n}=={v} where {lock.constrained_by} pins {base[n]}"
                         for n, v in sorted(pins.items()) if n in base and base[n] != v and n not in lock.own]
    problems += _stub_runtime_problems(root)
    return problems


def _stub_runtime_problems(root: Path) -> list[str]:
    """The committed stubs refuse to import under an older grpcio/protobuf than they were generated for: pyproject's
    lower bounds must admit no such release (else `pip install rlfleet` can pick one and fail at import)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    stubs = root / "rlfleet" / "v1"
    grpc_stamp = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", (stubs / "buffer_pb2_grpc.py").read_text())
    proto_stamp = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", (stubs / "buffer_pb2.py").read_text())
    if grpc_stamp is None or proto_stamp is None:
        return ["rlfleet/v1: cannot read the generated stubs' version stamps (the generator's format changed?)"]
    needs = {"grpcio": Version(grpc_stamp[1]), "protobuf": Version(".".join(proto_stamp.groups()))}
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    problems = []
    for text in deps:
        req = Requirement(text)
        need = needs.get(normalize(req.name))
        if need is None:
            continue
        floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
        if not floors or max(floors) < need:
            problems.append(f"pyproject.toml asks for {text!r} but the committed stubs need {req.name}>={need}")
    return problems


# --- refresh: re-resolve with uv, then regenerate what the pins decide ----------------------------------------------

def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        raise SystemExit("refresh needs uv from the dev lock: run it with .venv/bin/python after bash scripts/dev.sh "
                         "test has set .venv up")
    return str(uv)


def compile_lock(lock: Lock, upgrade: bool, upgrade_packages: list[str]) -> None:
    cmd = [_uv(), "pip", "compile", *lock.inputs, "--generate-hashes", "--python-version", PYTHON_VERSION,
           "--python-platform", PLATFORM, "--overrides", "locks/overrides.txt", "-o", str(lock.path.relative_to(ROOT)),
           "--custom-compile-command", "python scripts/locks.py refresh", "--quiet"]
    for extra in lock.extras:
        cmd += ["--extra", extra]
    if lock.find_links:
        cmd += ["--find-links", FIND_LINKS, "--emit-find-links"]
    if lock.constrained_by:
        base = read_pins(BY_NAME[lock.constrained_by].path)
        pins = "".join(f"{name}=={version}\n" for name, version in sorted(base.items()) if name not in lock.own)
        constraints = Path("build") / "locks" / f"{lock.constrained_by}-pins.txt"    # a stable name: uv cites it
        (ROOT / constraints).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / constraints).write_text(pins)
        cmd += ["--constraints", str(constraints)]
    if lock.no_deps:
        cmd.append("--no-deps")
    if upgrade:
        cmd.append("--upgrade")
    for package in upgrade_packages:
        cmd += ["--upgrade-package", package]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    _hash_local_wheels(lock.path)


def _hash_local_wheels(path: Path) -> None:
    """uv leaves a pin unhashed when it comes from --find-links under --no-deps (torch's CPU wheel in sglang-cpu):
    hash that file here, so every pin of every lock is checked at install."""
    lines = path.read_text().splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        match = _PIN.match(line)
        hashed = i + 1 < len(lines) and lines[i + 1].strip().startswith("--hash=")
        if match and not hashed and not line.rstrip().endswith("\\"):
            name, version = match[1], match[2]
            stem = f"{name.replace('-', '_')}-{version}-"
            wheels = sorted(p for p in Path(FIND_LINKS).glob("*.whl") if p.name.lower().startswith(stem.lower()))
            if not wheels:
                raise SystemExit(f"{path.name}: {name}=={version} has no hash and no wheel in {FIND_LINKS}")
            out.append(f"{line} \\")
            out += [f"    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}" for w in wheels]
            continue
        out.append(line)
    path.write_text("\n".join(out) + "\n")


def refresh(upgrade: bool, upgrade_packages: list[str]) -> int:
    before = {lock.name: read_pins(lock.path) if lock.path.exists() else {} for lock in ALL_LOCKS}
    for lock in ALL_LOCKS:
        compile_lock(lock, upgrade, upgrade_packages)
    for lock in ALL_LOCKS:
        after = read_pins(lock.path)
        for name in sorted(set(before[lock.name]) | set(after)):
            old, new = before[lock.name].get(name), after.get(name)
            if old != new:
                print(f"{lock.name}: {name} {old or '(new)'} -> {new or '(removed)'}")
    # What the pins decide is regenerated by the new toolchain: rebuild .venv from the new lock, then run its
    # generators (a stub made by the old grpcio-tools would fail the freshness check on every fresh clone).
    subprocess.run(["bash", "scripts/venv_from_lock.sh", ".venv", "locks/dev.txt", "--editable"], cwd=ROOT, check=True)
    venv_python = str(ROOT / ".venv" / "bin" / "python")
    subprocess.run([venv_python, "scripts/gen_protos.py"], cwd=ROOT, check=True)
    subprocess.run([venv_python, "scripts/gen_config_docs.py"], cwd=ROOT, check=True)
    problems = check()
    for problem in problems:
        print("locks check:", problem, file=sys.stderr)
    print("refreshed; review `git diff --stat locks rlfleet/v1 docs`, then run bash scripts/dev.sh test")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ref = sub.add_parser("refresh", help="re-resolve every lock, rebuild .venv, regenerate stubs and config docs")
    ref.add_argument("--upgrade", action="store_true", help="take the newest release the inputs allow, everywhere")
    ref.add_argument("--upgrade-package", action="append", default=[], metavar="NAME",
                     help="take the newest release of NAME only (repeatable)")
    sub.add_parser("check", help="offline: locks satisfy their inputs and agree with each other")
    ver = sub.add_parser("verify", help="this interpreter's environment holds exactly a lock's pins")
    ver.add_argument("lock", type=Path)
    ver.add_argument("--subset", action="store_true", help="only: nothing installed outside the lock's pins")
    ver.add_argument("--project", default=None, help="the editable project the venv also holds (e.g. rlfleet)")
    ns = parser.parse_args(argv)
    if ns.command == "refresh":
        return refresh(ns.upgrade, ns.upgrade_package)
    if ns.command == "check":
        problems = check()
    else:
        problems = verify(ns.lock, ns.subset, normalize(ns.project) if ns.project else None)
    for problem in problems:
        print(f"locks {ns.command}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
