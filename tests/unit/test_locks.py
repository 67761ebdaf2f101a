"""scripts/locks.py: a venv is compared with its lock name by name and version; `check` fails a pyproject.toml
dependency the locks do not hold, two locks that disagree, and floors that admit a grpcio/protobuf the committed
stubs refuse. The last test reads this very .venv against locks/dev.txt, as dev.sh does before every test run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from scripts import locks

ROOT = Path(__file__).resolve().parents[2]


def test_lock_lines_are_read_by_normalized_name(tmp_path: Path) -> None:
    lock = tmp_path / "x.txt"
    lock.write_text("--find-links /opt/wheels\n\nFoo_Bar.baz==1.2 \\\n    --hash=sha256:00\n    # via x\n"
                    "torch==2.13.0+cpu \\\n    --hash=sha256:11\nuvicorn[standard]==0.30.0\n")
    assert locks.read_pins(lock) == {"foo-bar-baz": "1.2", "torch": "2.13.0+cpu", "uvicorn": "0.30.0"}


def test_compare_names_extra_missing_and_moved_packages() -> None:
    pins = {"a": "1", "b": "2", "c": "3"}
    have = {"a": "1", "b": "2.1", "d": "4", "pip": "23.2.1", "setuptools": "65.5.0", "rlfleet": "0.1.0"}
    problems = locks.compare(pins, have, "dev.txt", subset=False, project="rlfleet")
    assert problems == ["b==2.1 is installed, dev.txt pins 2", "d==4 is installed but not in dev.txt",
                        "c==3 is in dev.txt but not installed"]
    # setuptools, which `python3.11 -m venv` bundles, is checked only where the lock pins it
    assert locks.compare({"setuptools": "84.2.1"}, {"setuptools": "65.5.0"}, "dev.txt", subset=True, project=None) == [
        "setuptools==65.5.0 is installed, dev.txt pins 84.2.1"]
    # --subset: what is there must be locked; what is not there yet is fine (a venv about to be topped up)
    assert locks.compare(pins, {"a": "1", "pip": "1"}, "dev.txt", subset=True, project=None) == []
    assert locks.compare(pins, {"a": "1"}, "dev.txt", subset=True, project="rlfleet") == [
        "the project (rlfleet) is not installed"]


def _copy_tree(tmp: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    shutil.copytree(ROOT / "locks", tmp / "locks")
    (tmp / "rlfleet" / "v1").mkdir(parents=True)
    for stub in ("buffer_pb2.py", "buffer_pb2_grpc.py"):
        shutil.copy(ROOT / "rlfleet" / "v1" / stub, tmp / "rlfleet" / "v1" / stub)
    return tmp


def test_check_passes_on_the_committed_locks(tmp_path: Path) -> None:
    assert locks.check(_copy_tree(tmp_path)) == []


def test_check_fails_a_dependency_added_without_a_refresh(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    text = (root / "pyproject.toml").read_text()
    added = text.replace('  "blake3>=1.0",\n', '  "blake3>=1.0",\n  "sortedcollections>=2",\n')
    assert added != text
    (root / "pyproject.toml").write_text(added)
    assert "dev: 'sortedcollections>=2' is asked for but not locked: run python scripts/locks.py refresh" in \
        locks.check(root)


def test_check_fails_a_pin_outside_the_range_asked_for(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(re.sub(r'"numpy>=[^"]+"', '"numpy>=99"', text))
    problems = locks.check(root)
    assert any(p.startswith("dev: numpy==") and "does not satisfy 'numpy>=99'" in p for p in problems), problems
    assert any(p.startswith("runtime: numpy==") for p in problems), problems


def test_check_fails_two_locks_that_disagree(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    runtime = root / "locks" / "runtime.txt"
    version = locks.read_pins(runtime)["pydantic"]
    runtime.write_text(runtime.read_text().replace(f"\npydantic=={version} ", "\npydantic==0.0.1 "))
    assert f"runtime pins pydantic==0.0.1 where dev pins {version}" in locks.check(root)


def test_check_fails_a_pin_without_a_hash(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    lock = root / "locks" / "sglang-cpu.txt"
    lines = lock.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("torch=="))
    assert lines[at + 1].strip().startswith("--hash=sha256:")
    lock.write_text("\n".join(lines[:at] + [lines[at].removesuffix(" \\")] + lines[at + 2:]) + "\n")
    assert "sglang-cpu: torch has no --hash (every file must be checked at install)" in locks.check(root)


def test_check_fails_floors_the_stubs_refuse(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(re.sub(r'"grpcio>=[^"]+"', '"grpcio>=1.66"', text))
    stamp = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", (ROOT / "rlfleet/v1/buffer_pb2_grpc.py").read_text())
    assert stamp is not None
    assert f"pyproject.toml asks for 'grpcio>=1.66' but the committed stubs need grpcio>={stamp[1]}" in \
        locks.check(root)


def test_this_venv_holds_exactly_the_dev_lock() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "locks.py"), "verify", str(ROOT / "locks/dev.txt"),
                           "--project", "rlfleet"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
