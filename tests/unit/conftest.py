"""Fixtures shared by the unit tests: a tiny random llama folder (`tiny_model_dir`) and a torch engine on it
(`tiny_engine`), each made once per test module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from tests.support.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Iterator[TorchEngine]:
    eng = TorchEngine(tiny_model_dir, max_batch_size=32)
    yield eng
    eng.shutdown()
