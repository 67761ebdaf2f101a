"""Shared pytest setup: one torch thread per process (2-core CI), repo root importable, tests that need a missing
tool skipped (failed under CI=true: tests/support/requires.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from tests.support.requires import MARK, check_marks  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(reason): needs a tool the CI script installs (support/requires.py)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marks(item)


@pytest.fixture(scope="module")
def gloo_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A one-rank gloo process group for the module's tests (the trainer's collectives need one)."""
    import torch.distributed as dist

    from rlfleet.services.trainer.distributed_exit import leave_distributed

    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    leave_distributed()
