"""The fault harness's run mode in CI: one seed of the real `rlfleet run` launcher and its five service processes
(tests.faults.run_mode), with the faults that one launch survives: SIGSTOP/SIGCONT of trainer-0, then of the buffer,
then SIGKILL of a rollout replica (the launcher restarts it; its groups are re-queued).
Cost: one launch of the services plus 30 steps: about 20 s on a quiet 2-core machine (a step takes ~0.1 s there),
about 60 s on a loaded one. The faults land at steps 1, 9 and 12 (tests.faults.run_mode.schedule keeps them in the
first half), so each lands while the run is live however fast its steps are. The faults that end a run (SIGKILL
of trainer-0, the buffer, weight_sync; resumed with --resume) and redis-server's:
python -m tests.faults.harness --mode run --seeds 100 [--store both]."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.run_mode import run_seed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, SAMPLES_PER_STEP = 30, 4        # groups_per_step 2 x group_size 2 (run_mode.overrides)
IN_RUN = ("replica_kill9", "replica_stop", "trainer_stop", "buffer_stop", "weight_sync_stop")


def test_real_services_lose_nothing_under_kills_and_stops(tmp_path: Path) -> None:
    verdict, events = run_seed(6, "embedded", tmp_path, steps=STEPS, faults=3, kinds=IN_RUN)
    print("\n" + verdict.line() + "\n  " + "\n  ".join(events))
    context = f"{verdict}\n" + "\n".join(events) + f"\nlogs: {tmp_path / 'run' / 'logs'}"
    assert [e.split()[1] for e in events] == ["trainer_stop", "buffer_stop", "replica_kill9"], context
    assert verdict.trained == STEPS * SAMPLES_PER_STEP, context
    assert (verdict.lost, verdict.trained_twice, verdict.unexpected) == ([], [], []), context
    assert verdict.recovered == {"trainer_stop": 1, "buffer_stop": 1, "replica_kill9": 1}, context
