"""scripts/venv_from_lock.sh: a venv holds exactly its lock or is rebuilt. Half-made (a set-up killed before pip was
in place, or before the stamp was written), kept from an older lock, or changed by hand: each is detected and built
again by the next call, with no folder to delete by hand. The locks here pin two tiny wheels made by the test (pip
runs with --no-index: nothing is downloaded)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel holding one module `name` with VERSION = version."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


def _lock(path: Path, wheels: list[tuple[str, str, Path]]) -> Path:
    lines = [f"--find-links {wheels[0][2].parent}", ""]
    for name, version, wheel in wheels:
        lines += [f"{name}=={version} \\", f"    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return tmp_path, env


def _run(venv: Path, lock: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "venv_from_lock.sh"), str(venv), str(lock)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def _versions(venv: Path) -> str:
    code = "import importlib.metadata as m; print(sorted((d.metadata['Name'], d.version) for d in m.distributions() " \
           "if d.metadata['Name'] not in ('pip', 'setuptools')))"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_built_then_kept_then_rebuilt_when_the_lock_moves(setup: tuple[Path, dict[str, str]]) -> None:
    tmp, env = setup
    a1, b1 = _wheel(tmp / "wheels", "rlfprobe_a", "1.0"), _wheel(tmp / "wheels", "rlfprobe_b", "1.0")
    lock = _lock(tmp / "probe.txt", [("rlfprobe_a", "1.0", a1), ("rlfprobe_b", "1.0", b1)])
    venv = tmp / "venv"
    first = _run(venv, lock, env)
    assert first.returncode == 0, first.stderr
    assert "built from" in first.stdout
    assert _versions(venv) == "[('rlfprobe_a', '1.0'), ('rlfprobe_b', '1.0')]"
    again = _run(venv, lock, env)
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr    # a verified no-op

    a2 = _wheel(tmp / "wheels", "rlfprobe_a", "2.0")
    _lock(lock, [("rlfprobe_a", "2.0", a2), ("rlfprobe_b", "1.0", b1)])                  # a refreshed lock
    moved = _run(venv, lock, env)
    assert moved.returncode == 0, moved.stderr
    assert "rlfprobe-a==1.0 is installed, probe.txt pins 2.0" in moved.stdout
    assert _versions(venv) == "[('rlfprobe_a', '2.0'), ('rlfprobe_b', '1.0')]"


def test_half_made_venvs_are_rebuilt(setup: tuple[Path, dict[str, str]]) -> None:
    tmp, env = setup
    a1 = _wheel(tmp / "wheels", "rlfprobe_a", "1.0")
    lock = _lock(tmp / "probe.txt", [("rlfprobe_a", "1.0", a1)])
    venv = tmp / "venv"
    # killed right after `python3 -m venv` started: no pip in it (every later pip call failed before)
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    no_pip = _run(venv, lock, env)
    assert no_pip.returncode == 0, no_pip.stderr
    assert "rebuilding" in no_pip.stdout and _versions(venv) == "[('rlfprobe_a', '1.0')]"

    # killed after the packages, before the stamp: not trusted, built again
    for stamp in venv.glob(".locked-*"):
        stamp.unlink()
    no_stamp = _run(venv, lock, env)
    assert no_stamp.returncode == 0 and "rebuilding" in no_stamp.stdout, no_stamp.stdout + no_stamp.stderr

    # a package added by hand: the venv no longer holds exactly the lock
    extra = _wheel(tmp / "wheels", "rlfprobe_extra", "1.0")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(extra)], env=env, check=True)
    by_hand = _run(venv, lock, env)
    assert by_hand.returncode == 0, by_hand.stderr
    assert "rlfprobe-extra==1.0 is installed but not in probe.txt" in by_hand.stdout
    assert _versions(venv) == "[('rlfprobe_a', '1.0')]"


def test_a_venv_verified_against_a_wider_lock_is_accepted_or_topped_up(setup: tuple[Path, dict[str, str]]) -> None:
    tmp, env = setup
    a1, b1 = _wheel(tmp / "wheels", "rlfprobe_a", "1.0"), _wheel(tmp / "wheels", "rlfprobe_b", "1.0")
    narrow = _lock(tmp / "narrow.txt", [("rlfprobe_a", "1.0", a1)])
    wide = _lock(tmp / "wide.txt", [("rlfprobe_a", "1.0", a1), ("rlfprobe_b", "1.0", b1)])
    venv = tmp / "venv"
    assert _run(venv, narrow, env).returncode == 0
    topped = _run(venv, wide, env)                 # `dev.sh run` then `dev.sh test`: the wider lock tops it up
    assert topped.returncode == 0 and "topped up" in topped.stdout, topped.stdout + topped.stderr
    assert _versions(venv) == "[('rlfprobe_a', '1.0'), ('rlfprobe_b', '1.0')]"
    accept = subprocess.run(["bash", str(ROOT / "scripts" / "venv_from_lock.sh"), str(venv), str(narrow),
                             "--accept", str(wide)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert accept.returncode == 0 and accept.stdout == "", accept.stdout + accept.stderr


def test_refuses_to_delete_a_path_that_is_not_a_venv_folder(setup: tuple[Path, dict[str, str]]) -> None:
    tmp, env = setup
    for bad in ("", "/", "."):
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "venv_from_lock.sh"), bad, str(tmp / "none.txt")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "refusing" in proc.stderr
