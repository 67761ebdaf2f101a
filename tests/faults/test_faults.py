"""The fault harness's CI seeds: each a real buffer service under a seeded schedule of faults (tests.faults.harness).
Longer runs: python -m tests.faults.harness --seeds 100."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.harness import run_seed

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("store", "seed"), [("embedded", 3), ("embedded", 2), ("redis", 1)])
def test_nothing_lost_nor_trained_twice_under_faults(tmp_path: Path, store: str, seed: int) -> None:
    verdict, events = run_seed(seed, store, tmp_path)
    print(f"\n{store} seed {seed}: {verdict.line()}\n  " + "\n  ".join(events))
    context = f"{verdict}\n" + "\n".join(events)
    assert len(events) >= 3, context                      # faults were injected while the run was going
    assert verdict.put >= 64 and verdict.trained == 64, context
    assert (verdict.lost, verdict.trained_twice, verdict.unexpected) == ([], [], []), context
    assert not any(verdict.unrecovered.values()), context
