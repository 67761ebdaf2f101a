"""One warm-start model for every end-to-end test (built once per session, ~30 s)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from examples.addition.warm_start import prepare

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("model") / "warm_start"
    prepare(str(path), seed=0)
    return path
