"""One warm-start model for every end-to-end test (built once per session, ~30 s): the addition example's recipe
trained in-process (examples/addition/warm_start.py prepare_in_process; the example itself trains it with rlfleet's
SFT, which tests/e2e/test_sft_distill.py runs)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from examples.addition.warm_start import prepare_in_process

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("model") / "warm_start"
    prepare_in_process(str(path), seed=0)
    return path
