"""Each controller decision on its own: from a snapshot of pods and nodes to the failure it names."""

from __future__ import annotations

import pytest

from rlfleet.runtime import exit_codes
from rlfleet.runtime.exit_codes import DEVICE_FAULT, is_device_fault
from rlfleet.services.controller.decisions import (
    DEAD_REPLICA,
    HUNG_RANK,
    NODE_FAILURE,
    RANK_FAILURE,
    hung_failure,
    replica_failures,
    trainer_failures,
)
from rlfleet.services.controller.exit_rules import BY_EXIT_CODE
from rlfleet.services.controller.objects import Node, Pod, Snapshot
from rlfleet.services.controller.progress import HungTracker, TrainerProgress, suspect_ranks
from tests.cluster.k8s_objects import node, pod

Q = "rlfleet.io/quarantined"


def snap(pods: list[dict], nodes: list[dict], now: float = 2000.0) -> Snapshot:
    return Snapshot(now=now, pods=tuple(Pod.from_json(p) for p in pods),
                    nodes={n["metadata"]["name"]: Node.from_json(n, Q) for n in nodes})


def gang(n: int = 4, /, **overrides: dict) -> list[dict]:
    return [pod(f"run1-trainer-{i}", "trainer", f"n{i}", **overrides.get(str(i), {})) for i in range(n)]


NODES = [node(f"n{i}") for i in range(6)]


def test_healthy_run_needs_nothing() -> None:
    s = snap(gang() + [pod("run1-rollout-a", "rollout", "n4")], NODES)
    assert trainer_failures(s) == [] and replica_failures(s, 300) == []


def test_node_lost_under_a_rank_quarantines_it_and_restarts_the_gang() -> None:
    nodes = [node("n0"), node("n1"), node("n2", ready=False), node("n3")]
    (f,) = trainer_failures(snap(gang(), nodes))
    assert f.kind == NODE_FAILURE and f.quarantine == ("n2",) and f.force
    assert [name for name, _ in f.delete_pods] == [f"run1-trainer-{i}" for i in range(4)]


def test_failed_rank_quarantines_only_its_node() -> None:
    (f,) = trainer_failures(snap(gang(**{"1": {"exit_code": DEVICE_FAULT, "ready": False}}), NODES))
    assert f.kind == RANK_FAILURE and f.quarantine == ("n1",) and len(f.delete_pods) == 4 and not f.force
    assert "accelerator faulty" in f.reason


@pytest.mark.parametrize(("code", "reason", "node_fault"), [
    (1, "Error", False),                # the trainer's crash: its own error or its data's
    (2, "Error", False),                # bad config
    (3, "Error", False),                # engine unhealthy (rollout), superseded buffer
    (137, "OOMKilled", False),          # the container's memory limit: the run's sizing
    (137, "Error", False),              # killed from outside: eviction, preemption
    (143, "Error", False),              # SIGTERM
    (134, "Error", False),              # SIGABRT: a watchdog or an assertion in native code
    (139, "Error", False),              # SIGSEGV: software, usually
    (42, "Error", False),               # not listed: restart only
    (DEVICE_FAULT, "Error", True),      # the process found its accelerator faulty
    (135, "Error", True),               # SIGBUS: a hardware memory error
])
def test_only_node_level_exits_quarantine(code: int, reason: str, node_fault: bool) -> None:
    """The exit-code table (rlfleet/services/controller/exit_rules.py): application exits restart the gang, never
    taint."""
    (f,) = trainer_failures(snap(gang(**{"2": {"exit_code": code, "reason": reason, "ready": False}}), NODES))
    assert f.kind == RANK_FAILURE and len(f.delete_pods) == 4
    assert f.quarantine == (("n2",) if node_fault else ()), f.reason
    assert f"exit {code}" in f.reason


def test_every_rlfleet_exit_code_is_in_the_table_and_only_device_fault_is_the_nodes() -> None:
    codes = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int) and v}
    assert codes <= set(BY_EXIT_CODE)
    assert {c for c in codes if BY_EXIT_CODE[c].node_fault} == {DEVICE_FAULT}


def test_a_crash_looping_rank_of_a_poison_batch_taints_nothing() -> None:
    """Exit 1 again and again on the same node (a crash loop): still the application's, never the node's."""
    (f,) = trainer_failures(snap(gang(**{"0": {"exit_code": 1, "crash_loop": True, "ready": False}}), NODES))
    assert f.quarantine == () and "application error" in f.reason


def test_device_faults_are_told_from_program_errors() -> None:
    assert is_device_fault(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    try:
        try:
            raise RuntimeError("NCCL WARN Cuda failure 'GPU has fallen off the bus'")
        except RuntimeError as inner:
            raise ValueError("step 3 failed") from inner
    except ValueError as outer:
        assert is_device_fault(outer)
    for text in ("CUDA error: device-side assert triggered", "CUDA out of memory", "illegal memory access",
                 "index out of range in self"):
        assert not is_device_fault(RuntimeError(text)), text


def test_crash_loop_and_failed_phase_are_failures() -> None:
    (a,) = trainer_failures(snap(gang(**{"2": {"crash_loop": True, "ready": False}}), NODES))
    (b,) = trainer_failures(snap(gang(**{"3": {"phase": "Failed", "ready": False}}), NODES))
    assert a.kind == b.kind == RANK_FAILURE and len(a.delete_pods) == len(b.delete_pods) == 4
    assert a.quarantine == b.quarantine == (), "no node-level exit recorded: restart only"


def test_oom_kill_restarts_without_quarantine() -> None:
    (f,) = trainer_failures(snap(gang(**{"0": {"exit_code": 137, "reason": "OOMKilled", "ready": False}}), NODES))
    assert f.kind == RANK_FAILURE and f.quarantine == () and len(f.delete_pods) == 4


def test_a_restarted_but_ready_rank_is_not_a_failure() -> None:
    assert trainer_failures(snap(gang(**{"1": {"exit_code": 1, "ready": True}}), NODES)) == []


def test_failure_keys_are_stable_and_specific() -> None:
    a = trainer_failures(snap(gang(**{"1": {"exit_code": 1, "ready": False}}), NODES))[0]
    b = trainer_failures(snap(gang(**{"1": {"exit_code": 1, "ready": False}}), NODES, now=9999))[0]
    c = trainer_failures(snap(gang(**{"1": {"exit_code": 1, "ready": False, "uid": "new"}}), NODES))[0]
    assert a.key == b.key != c.key


def test_dead_replica_by_failure_lost_node_or_long_unready() -> None:
    pods = [pod("r-failed", "rollout", "n0", phase="Failed", ready=False),
            pod("r-lost", "rollout", "n5"),
            pod("r-stuck", "rollout", "n1", ready=False, ready_since=1500.0),
            pod("r-starting", "rollout", "n1", ready=False, ready_since=1900.0, created=1900.0),
            pod("r-fine", "rollout", "n2")]
    nodes = NODES[:5] + [node("n5", ready=False)]
    got = {f.delete_pods[0][0]: f for f in replica_failures(snap(pods, nodes), dead_after=300)}
    assert set(got) == {"r-failed", "r-lost", "r-stuck"}
    assert all(f.kind == DEAD_REPLICA and f.quarantine == () for f in got.values())
    assert got["r-lost"].force and not got["r-failed"].force


def test_a_replica_draining_after_a_scale_in_is_not_dead() -> None:
    """Scaled in: a terminating replica drains (not Ready) for as long as rollout.drain_seconds, which may outlast
    replica_dead_after; a deleting pod is Kubernetes's to finish, never a failure."""
    draining = pod("r-draining", "rollout", "n1", ready=False, ready_since=1000.0)
    draining["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert replica_failures(snap([draining, pod("r-fine", "rollout", "n2")], NODES), dead_after=300) == []


def test_hung_tracker_needs_no_progress_past_the_deadline_with_batches_ready() -> None:
    t = HungTracker(hung_after=600)
    ready = TrainerProgress(step=7, ready_groups=16, groups_per_step=8)
    assert not t.observe(ready, 0) and not t.observe(ready, 599)
    assert t.observe(ready, 600)
    starved = TrainerProgress(step=7, ready_groups=3, groups_per_step=8)
    assert not t.observe(starved, 2000), "a starved trainer is not hung"
    assert not t.observe(TrainerProgress(step=8, ready_groups=16, groups_per_step=8), 2001), "progress resets"
    assert not t.observe(TrainerProgress(step=8, ready_groups=16, finished=True), 9999)
    assert not t.observe(TrainerProgress(step=None, ready_groups=16), 9999)


def test_suspects_are_ranks_whose_own_step_is_stale_while_others_are_fresh() -> None:
    prog = TrainerProgress(step=7, ready_groups=8, rank_last_step={"t-0": 1900.0, "t-1": 500.0, "t-2": None})
    assert suspect_ranks(prog, now=2000, hung_after=600) == ["t-1"], "no metrics is unknown, not guilty"
    all_stale = TrainerProgress(step=7, ready_groups=8, rank_last_step={"t-0": 100.0, "t-1": 100.0})
    assert suspect_ranks(all_stale, now=2000, hung_after=600) == []


def test_hung_failure_blames_suspects_else_unready_ranks_else_nobody() -> None:
    s = snap(gang(**{"2": {"ready": False}}), NODES)
    assert hung_failure(s, 7, ["run1-trainer-1"]).quarantine == ("n1",)
    assert hung_failure(s, 7, []).quarantine == ("n2",)
    f = hung_failure(snap(gang(), NODES), 7, [])
    assert f.kind == HUNG_RANK and f.quarantine == () and len(f.delete_pods) == 4
