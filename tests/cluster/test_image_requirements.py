"""Each image's lock alone is enough to run its service: installed into a fresh venv (no container engine needed),
every service the image starts answers `--help` and every module it may load imports (docker/import_check.py). A
dependency added to pyproject.toml but missing from an image's lock fails here, as does one the lock loses (shown by
taking `cryptography` and `math-verify` out of a fresh runtime venv: every service then dies at import, and the
stock `math` reward's lazy import is named).

The venvs come from pip's cache after the first set-up (~1 min each); the CUDA lock cannot be installed here (PyPI's
CUDA torch is several GB and needs a GPU to import its kernels), so it is checked to hold the runtime lock's closure
at the same versions, with its CUDA torch instead of the CPU one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.locks import read_pins

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"
SERVICES = ("buffer", "weight_sync", "trainer", "rollout")


def _fresh_venv(where: Path, lock: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
                           "--only-binary", ":all:", "-r", str(lock)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def _import_check(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # cwd is a scratch folder and PYTHONPATH is unset: only the venv and the source tree (--root) are visible
    return subprocess.run([str(python), str(ROOT / "docker" / "import_check.py"), "--root", str(ROOT), *args],
                          capture_output=True, text=True, timeout=900, cwd=python.parent, env=_clean_env())


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def test_runtime_lock_runs_every_cpu_service_and_a_lost_dependency_fails(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "runtime", LOCKS / "runtime.txt")
    entries = [arg for svc in SERVICES for arg in ("--entry", f"rlfleet.services.{svc}")]
    ok = _import_check(python, *entries, "--walk", "rlfleet")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "import_check: ok (4 entry points, 1 packages walked)" in ok.stdout

    # The lock loses two dependencies: one every service imports at start-up, one a stock reward imports when used.
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "cryptography", "math-verify"], check=True,
                   timeout=120)
    lost = _import_check(python, *entries, "--walk", "rlfleet")
    assert lost.returncode == 1, lost.stdout
    for svc in SERVICES:
        assert f"python -m rlfleet.services.{svc} --help exited 1" in lost.stdout
    assert "no module 'cryptography'" in lost.stdout
    assert "rlfleet/rewards/stock.py imports 'math_verify', which is not installed" in lost.stdout


def test_controller_lock_runs_the_controller_without_torch(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "controller", LOCKS / "controller.txt")
    proc = _import_check(python, "--entry", "rlfleet.services.controller", "--walk", "rlfleet.services.controller")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    has_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, timeout=60)
    assert has_torch.returncode != 0, "the controller image carries torch"


def test_cuda_lock_holds_the_runtime_closure_with_a_cuda_torch() -> None:
    runtime, cuda = read_pins(LOCKS / "runtime.txt"), read_pins(LOCKS / "image-cuda.txt")
    build_only = {"setuptools", "wheel"}           # the runtime lock's editable install of the project needs these
    for name, version in runtime.items():
        if name in build_only:
            continue
        assert name in cuda, f"image-cuda.txt lacks {name}"
        if name == "torch":
            assert version.split("+")[0] == cuda[name] and "+" not in cuda[name], (version, cuda[name])
        else:
            assert cuda[name] == version, (name, version, cuda[name])
    assert {"megatron-core", "nixl"} <= set(cuda)
    assert any(name.startswith("nvidia-") for name in cuda), "no CUDA runtime wheels in the CUDA lock"
    assert read_pins(LOCKS / "sglang-cuda.txt").get("sglang") == "0.5.23"


@pytest.mark.parametrize("lock", ["runtime.txt", "controller.txt", "image-cuda.txt", "sglang-cuda.txt"])
def test_image_locks_pin_every_file_by_hash(lock: str) -> None:
    lines = (LOCKS / lock).read_text().splitlines()
    pinned = [i for i, line in enumerate(lines) if line[:1].isalpha()]
    assert len(pinned) == len(read_pins(LOCKS / lock)) > 0
    for i in pinned:            # `name==version \` then one `--hash=sha256:` line per file of that release
        assert lines[i].endswith("\\") and lines[i + 1].strip().startswith("--hash=sha256:"), lines[i]
