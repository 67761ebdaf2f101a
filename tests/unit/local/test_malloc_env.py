"""Local services start with glibc malloc set to keep freed memory (rlfleet/local/malloc_env.py): the launcher's service
environment carries the setting unless the user set their own, and a process started with it serves a multi-MiB
allocation from its heap, where reuse needs no page faults, instead of from a fresh mmap."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.local.malloc_env import MALLOC_TUNABLES
from rlfleet.local.warm_interpreters import service_env

# allocate 4 MiB with the C library's malloc, print whether it lies inside the [heap] mapping
PROBE = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
addr = libc.malloc(4 << 20)
for line in open("/proc/self/maps"):
    span, *rest = line.split()
    lo, hi = (int(x, 16) for x in span.split("-"))
    if lo <= addr < hi:
        print("heap" if line.rstrip().endswith("[heap]") else "mmap")
        break
"""


def test_service_env_sets_it_and_keeps_a_users_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert service_env()["GLIBC_TUNABLES"] == MALLOC_TUNABLES
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert service_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="GLIBC_TUNABLES is read by glibc only")
def test_a_process_started_with_it_allocates_from_its_heap() -> None:
    def where(tunables: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
        if tunables is not None:
            env["GLIBC_TUNABLES"] = tunables
        return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert where(None) == "mmap"                 # glibc's default: above 128 KiB, a fresh mapping
    assert where(MALLOC_TUNABLES) == "heap"


@pytest.mark.parametrize("image", ["trainer-cpu", "trainer-cuda", "rollout-cpu", "rollout-cuda"])
def test_the_heavy_service_images_set_the_same(image: str) -> None:
    text = (Path(__file__).resolve().parents[3] / "docker" / f"{image}.Dockerfile").read_text()
    # the whole value: the ENV line may end there or continue with another variable
    assert re.search(rf"^ENV GLIBC_TUNABLES={re.escape(MALLOC_TUNABLES)}( \\)?$", text, re.M), text
