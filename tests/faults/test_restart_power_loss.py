"""CI seeds of tests.faults.restart_power_loss: a buffer killed before its fsync, restarted, then a power loss;
what the restarted store served or acknowledged survives (it fsyncs the log it read before serving from it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.restart_power_loss import run_case
from tests.unit.test_buffer_durability import fingerprint


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_what_a_restarted_buffer_serves_survives_a_power_loss(tmp_path: Path, seed: int) -> None:
    served, after, line = run_case(seed, tmp_path, fingerprint)
    print(f"\n{line}")
    assert after == served, line
