"""Cores per local service: sensible defaults for 1, 2 and 64 CPUs, sync and async, and per-service overrides."""

from __future__ import annotations

import os

from rlfleet.config import PlacementConfig
from rlfleet.local.placement import Placement, plan
from rlfleet.local.processes import Child


def test_one_cpu_puts_everything_on_it_with_one_thread() -> None:
    for overlap in (False, True):
        got = plan([3], trainer_ranks=1, replicas=1, overlap=overlap)
        assert got == {name: Placement((3,), 1) for name in ("buffer", "weight_sync", "trainer-0", "rollout-0")}


def test_two_cpus_split_when_rollout_and_training_overlap() -> None:
    got = plan([0, 1], trainer_ranks=1, replicas=1, overlap=True)
    assert got["trainer-0"] == Placement((0,), 1)
    assert got["rollout-0"] == Placement((1,), 1)
    assert got["buffer"] == got["weight_sync"] == Placement((0, 1), 1)


def test_two_cpus_shared_when_they_take_turns() -> None:
    got = plan([0, 1], trainer_ranks=1, replicas=1, overlap=False)
    assert got["trainer-0"] == got["rollout-0"] == Placement((0, 1), 2)     # each side has both CPUs in its turn
    got = plan([0, 1, 2, 3], trainer_ranks=2, replicas=4, overlap=False)
    assert got["trainer-0"] == got["trainer-1"] == Placement((0, 1, 2, 3), 2)   # ranks compute together: share
    assert all(got[f"rollout-{i}"] == Placement((0, 1, 2, 3), 1) for i in range(4))
    pinned = plan([0, 1], trainer_ranks=1, replicas=1, overlap=False, cfg=PlacementConfig(rollout={"cores": 1}))
    assert pinned["rollout-0"] == Placement((1,), 1)        # cores asked: pinned to its block, as when overlapping


def test_trainer_ranks_get_a_block_each() -> None:
    got = plan([0, 1], trainer_ranks=2, replicas=1, overlap=True)
    assert (got["trainer-0"], got["trainer-1"]) == (Placement((0,), 1), Placement((1,), 1))   # wraps: shares
    assert got["rollout-0"] == Placement((1,), 1)
    got = plan([0, 1, 2, 3], trainer_ranks=2, replicas=1, overlap=True)
    assert (got["trainer-0"], got["trainer-1"]) == (Placement((0,), 1), Placement((1,), 1))
    assert got["rollout-0"] == Placement((2, 3), 2)


def test_sixty_four_cpus() -> None:
    got = plan(list(range(64)), trainer_ranks=1, replicas=1, overlap=True)
    assert got["trainer-0"] == Placement(tuple(range(32)), 32)
    assert got["rollout-0"] == Placement(tuple(range(32, 63)), 31)
    assert got["buffer"] == got["weight_sync"] == Placement((63,), 1)
    sync = plan(list(range(64)), trainer_ranks=1, replicas=1, overlap=False)
    assert sync["trainer-0"] == sync["rollout-0"] == Placement(tuple(range(63)), 63)
    got = plan(list(range(64)), trainer_ranks=4, replicas=2, overlap=True)
    assert [got[f"trainer-{r}"].cpus for r in range(4)] == [tuple(range(8 * r, 8 * r + 8)) for r in range(4)]
    assert got["rollout-0"] == Placement(tuple(range(32, 47)), 15)
    assert got["rollout-1"] == Placement(tuple(range(47, 62)), 15)


def test_overrides_per_service_and_the_legacy_trainer_threads() -> None:
    cfg = PlacementConfig(rollout={"cores": 1, "threads": 3}, buffer={"threads": 2})
    got = plan([4, 5, 6, 7], trainer_ranks=1, replicas=1, overlap=True, cfg=cfg, trainer_threads=1)
    assert got["rollout-0"] == Placement((6,), 3)
    assert got["trainer-0"] == Placement((4, 5), 1)     # trainer.threads sets the trainer's threads only
    assert got["buffer"] == Placement((4, 5, 6, 7), 2)
    # more cores asked than there are: wraps around, never past the CPUs given
    got = plan([0, 1], trainer_ranks=1, replicas=1, overlap=True, cfg=PlacementConfig(rollout={"cores": 5}))
    assert got["rollout-0"] == Placement((0, 1), 2)


def test_a_child_runs_on_its_cpus(tmp_path) -> None:
    cpu = min(os.sched_getaffinity(0))
    child = Child("probe", ["-c", "import os; print(sorted(os.sched_getaffinity(0)))"], tmp_path / "probe.log",
                  dict(os.environ), cpus=[cpu])
    assert child.proc.wait(timeout=30) == 0
    child.stop()
    assert (tmp_path / "probe.log").read_text().strip() == str([cpu])
