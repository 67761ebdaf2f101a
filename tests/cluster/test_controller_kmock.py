"""The controller against an in-memory Kubernetes API (kmock) through the official client: each failure leads to the
right API calls, Events and metrics; a controller restarted mid-recovery finishes it exactly once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.tools import need_module

need_module("kubernetes", module_level=True)
need_module("kmock", module_level=True)

from rlfleet.services.controller.kube import Kube  # noqa: E402
from rlfleet.services.controller.progress import TrainerProgress  # noqa: E402
from tests.cluster.controller_rig import Clock, Cluster, ScriptedProgress, build_controller, sample  # noqa: E402
from tests.cluster.k8s_objects import node, pod  # noqa: E402
from tests.cluster.kmock_server import KmockApi  # noqa: E402

Q = "rlfleet.io/quarantined"


@pytest.fixture()
def api() -> Iterator[KmockApi]:
    need_module("kmock")
    server = KmockApi().start()
    yield server
    server.stop()


@pytest.fixture()
def cluster(api: KmockApi) -> Cluster:
    c = Cluster(api)
    for i in range(5):                       # n0, n1 run ranks; n2, n3 rollout; n4 holds a spare
        c.add_node(node(f"n{i}"))
    c.add_pod(pod("run1-trainer-0", "trainer", "n0", ip="10.0.0.1"))
    c.add_pod(pod("run1-trainer-1", "trainer", "n1", ip="10.0.0.2"))
    c.add_pod(pod("run1-rollout-a", "rollout", "n2"))
    c.add_pod(pod("run1-rollout-b", "rollout", "n3"))
    return c


def _statefulset_recreates_ranks(cluster: Cluster, nodes: tuple[str, str] = ("n0", "n4")) -> None:
    """What the StatefulSet controller does after the gang's pods are deleted (kmock schedules nothing)."""
    for rank, where in enumerate(nodes):
        cluster.add_pod(pod(f"run1-trainer-{rank}", "trainer", where, uid=f"uid-new-{rank}"))


def _quarantined(cluster: Cluster, name: str) -> bool:
    n = cluster.node(name)
    return n["metadata"]["labels"].get(Q) == "true" and any(t["key"] == Q and t["effect"] == "NoSchedule"
                                                            for t in n["spec"].get("taints", []))


def test_node_failure_quarantines_moves_the_rank_and_resumes(api: KmockApi, cluster: Cluster) -> None:
    clock, progress = Clock(), ScriptedProgress()
    ctl, reg = build_controller(api, clock, progress)
    assert ctl.reconcile() == []
    cluster.set_node_ready("n1", False)

    started = ctl.reconcile()
    assert len(started) == 1 and started[0].startswith("node-failure-")
    assert _quarantined(cluster, "n1") and not _quarantined(cluster, "n0")
    assert not {"run1-trainer-0", "run1-trainer-1"} & set(cluster.pods()), "the whole gang restarts"
    assert {"run1-rollout-a", "run1-rollout-b"} <= set(cluster.pods())
    assert len(cluster.requests("DELETE", "pods")) == 2
    assert cluster.reasons() == ["NodeQuarantined", "PodDeleted", "PodDeleted", "RecoveryStarted"]
    assert sample(reg, "rlfleet_controller_actions_total", action="quarantine_node") == 1
    assert sample(reg, "rlfleet_controller_actions_total", action="delete_pod") == 2
    assert sample(reg, "rlfleet_controller_recoveries_in_progress") == 1

    clock.now += 30
    assert ctl.reconcile() == [] and sample(reg, "rlfleet_controller_recoveries_total",
                                             kind="node_failure", outcome="done") == 0
    _statefulset_recreates_ranks(cluster)
    clock.now += 30
    ctl.reconcile()
    assert sample(reg, "rlfleet_controller_recoveries_total", kind="node_failure", outcome="done") == 1
    finished = [e for e in cluster.events() if e["reason"] == "RecoveryFinished"]
    assert len(finished) == 1 and "resumes from its last checkpoint" in finished[0]["message"]
    assert sample(reg, "rlfleet_controller_quarantined_nodes") == 1

    before = len(api.requests())
    clock.now += 30
    assert ctl.reconcile() == []
    mutating = [r for r in api.requests()[before:] if str(r.method).upper().split(".")[-1] in ("PATCH", "DELETE")]
    assert mutating == [], "a finished recovery is not repeated"


def test_hung_rank_is_blamed_quarantined_and_the_gang_restarts(api: KmockApi, cluster: Cluster) -> None:
    clock = Clock(now=10_000.0)
    progress = ScriptedProgress(TrainerProgress(step=41, ready_groups=32, groups_per_step=8, rank_last_step={
        "run1-trainer-0": 10_000.0, "run1-trainer-1": 10_000.0}))
    ctl, reg = build_controller(api, clock, progress)
    assert ctl.reconcile() == []
    clock.now += 599
    assert ctl.reconcile() == [], "not hung before the deadline"
    # Rank 1 stopped stepping; rank 0 is blocked in a collective but its own last step is fresh.
    progress.progress = TrainerProgress(step=41, ready_groups=32, groups_per_step=8, rank_last_step={
        "run1-trainer-0": clock.now, "run1-trainer-1": 9_000.0})
    clock.now += 2
    started = ctl.reconcile()
    assert len(started) == 1 and started[0].startswith("hung-rank-")
    assert _quarantined(cluster, "n1") and not _quarantined(cluster, "n0")
    assert not {"run1-trainer-0", "run1-trainer-1"} & set(cluster.pods())
    start_event = next(e for e in cluster.events() if e["reason"] == "RecoveryStarted")
    assert "hung_rank" in start_event["message"] and "run1-trainer-1" in start_event["message"]
    assert start_event["type"] == "Warning"
    assert sample(reg, "rlfleet_controller_recoveries_total", kind="hung_rank", outcome="started") == 1

    _statefulset_recreates_ranks(cluster)
    progress.progress = TrainerProgress(step=40, ready_groups=32, groups_per_step=8)   # resumed from checkpoint
    clock.now += 60
    assert ctl.reconcile() == []
    assert sample(reg, "rlfleet_controller_recoveries_total", kind="hung_rank", outcome="done") == 1


def test_a_starved_trainer_is_not_hung(api: KmockApi, cluster: Cluster) -> None:
    clock = Clock()
    progress = ScriptedProgress(TrainerProgress(step=5, ready_groups=0, groups_per_step=8))
    ctl, _ = build_controller(api, clock, progress)
    for _ in range(4):
        assert ctl.reconcile() == []
        clock.now += 1000
    assert cluster.requests("DELETE", "pods") == [] and cluster.reasons() == []


def test_dead_replica_is_replaced_and_its_groups_accounted(api: KmockApi, cluster: Cluster) -> None:
    clock, progress = Clock(), ScriptedProgress(tickets=12)
    cluster.core.delete_namespaced_pod("run1-rollout-b", "team-a")
    cluster.add_pod(pod("run1-rollout-b", "rollout", "n3", phase="Failed", ready=False, exit_code=1))
    ctl, reg = build_controller(api, clock, progress)

    started = ctl.reconcile()
    assert len(started) == 1 and started[0].startswith("dead-replica-")
    assert "run1-rollout-b" not in cluster.pods() and "run1-rollout-a" in cluster.pods()
    assert {"run1-trainer-0", "run1-trainer-1"} <= set(cluster.pods()), "the trainer is left alone"
    assert not _quarantined(cluster, "n3"), "a replica failure quarantines nothing"
    assert sample(reg, "rlfleet_controller_actions_total", action="delete_pod") == 1
    clock.now += 10
    assert ctl.reconcile() == []             # next pass: the pod is gone (the Deployment makes a new one)
    assert sample(reg, "rlfleet_controller_recoveries_total", kind="dead_replica", outcome="done") == 1
    done = next(e for e in cluster.events() if e["reason"] == "RecoveryFinished")
    assert "12 tickets in flight" in done["message"] and "re-queue" in done["message"]
    assert cluster.reasons() == ["PodDeleted", "RecoveryFinished", "RecoveryStarted"]


def test_replica_on_a_lost_node_is_force_deleted(api: KmockApi, cluster: Cluster) -> None:
    ctl, reg = build_controller(api, Clock(), ScriptedProgress())
    cluster.set_node_ready("n2", False)
    (rid,) = ctl.reconcile()
    assert rid.startswith("dead-replica-") and "run1-rollout-a" not in cluster.pods()
    (delete,) = cluster.requests("DELETE", "pods")
    assert delete.data["gracePeriodSeconds"] == 0 and delete.data["preconditions"]["uid"] == "uid-run1-rollout-a"


class CrashOnFirstDelete(Kube):
    """The controller process dies right after the quarantine step was saved, before deleting any pod."""

    crashed = False

    def delete_pod(self, name: str, uid: str, force: bool) -> bool:
        if not CrashOnFirstDelete.crashed:
            CrashOnFirstDelete.crashed = True
            raise SystemExit("controller killed mid-recovery")
        return super().delete_pod(name, uid, force)


def test_restart_mid_recovery_finishes_it_exactly_once(api: KmockApi, cluster: Cluster) -> None:
    clock = Clock()
    CrashOnFirstDelete.crashed = False
    first, first_reg = build_controller(api, clock, ScriptedProgress(), kube_cls=CrashOnFirstDelete)
    cluster.set_node_ready("n1", False)
    with pytest.raises(SystemExit):
        first.reconcile()
    assert _quarantined(cluster, "n1")
    assert {"run1-trainer-0", "run1-trainer-1"} <= set(cluster.pods()), "no pod deleted before the crash"
    assert sample(first_reg, "rlfleet_controller_recoveries_total", kind="node_failure", outcome="started") == 1

    # A new controller process: fresh memory and metrics, the same API (and the recovery record in it).
    clock.now += 20
    second, second_reg = build_controller(api, clock, ScriptedProgress())
    assert second.reconcile() == [], "the recovery continues; no second one starts"
    assert not {"run1-trainer-0", "run1-trainer-1"} & set(cluster.pods())
    _statefulset_recreates_ranks(cluster)
    clock.now += 20
    second.reconcile()
    clock.now += 20
    second.reconcile()

    node_patches = cluster.requests("PATCH", "nodes")
    quarantine_patches = [r for r in node_patches if "taints" in (r.data or {}).get("spec", {})]
    assert len(quarantine_patches) == 1, "the node is quarantined once"
    assert [t["key"] for t in cluster.node("n1")["spec"]["taints"]] == [Q]
    deletes = [r.data["preconditions"]["uid"] for r in cluster.requests("DELETE", "pods")]
    assert sorted(deletes) == ["uid-run1-trainer-0", "uid-run1-trainer-1"], "each rank deleted once"
    reasons = cluster.reasons()
    assert reasons.count("RecoveryStarted") == 1 and reasons.count("NodeQuarantined") == 1
    assert reasons.count("PodDeleted") == 2 and reasons.count("RecoveryFinished") == 1
    assert sample(second_reg, "rlfleet_controller_recoveries_total", kind="node_failure", outcome="started") == 0
    assert sample(second_reg, "rlfleet_controller_recoveries_total", kind="node_failure", outcome="done") == 1
    assert sample(second_reg, "rlfleet_controller_actions_total", action="quarantine_node") == 0
    assert sample(second_reg, "rlfleet_controller_actions_total", action="delete_pod") == 2


def test_recovery_that_never_completes_is_declared_failed(api: KmockApi, cluster: Cluster) -> None:
    clock = Clock()
    ctl, reg = build_controller(api, clock, ScriptedProgress())
    cluster.set_node_ready("n0", False)
    ctl.reconcile()
    clock.now += 1801                        # the StatefulSet never brought the ranks back
    ctl.reconcile()
    assert sample(reg, "rlfleet_controller_recoveries_total", kind="node_failure", outcome="failed") == 1
    failed = next(e for e in cluster.events() if e["reason"] == "RecoveryFailed")
    assert failed["type"] == "Warning"


def test_scaling_rollout_out_and_in_is_not_a_failure(api: KmockApi, cluster: Cluster) -> None:
    """`kubectl scale` (or the HPA/KEDA) takes rollout from 2 to 4 replicas and back mid-run: new pods start not
    Ready (loading the model), the removed ones go. The controller takes none of it for a failure: no pod deleted,
    no node quarantined, no recovery, while the trainer trains on."""

    clock = Clock()
    progress = ScriptedProgress(TrainerProgress(step=40, ready_groups=8, groups_per_step=8))
    ctl, reg = build_controller(api, clock, progress)
    assert ctl.reconcile() == []
    for name, where in (("run1-rollout-c", "n2"), ("run1-rollout-d", "n3")):        # scaled out to 4
        cluster.add_pod(pod(name, "rollout", where, ready=False, phase="Pending", created=clock.now,
                            ready_since=clock.now))
    for _ in range(4):                               # 4 x 60 s of start-up: less than replica_dead_after (300 s)
        clock.now += 60
        step = progress.progress.step
        assert step is not None
        progress.progress = TrainerProgress(step=step + 10, ready_groups=8, groups_per_step=8)
        assert ctl.reconcile() == []
    for name, where in (("run1-rollout-c", "n2"), ("run1-rollout-d", "n3")):        # both serving now
        cluster.core.delete_namespaced_pod(name, "team-a")
        cluster.add_pod(pod(name, "rollout", where, created=clock.now - 240, ready_since=clock.now))
    assert ctl.reconcile() == []
    for name in ("run1-rollout-a", "run1-rollout-b"):      # scaled in to 2: drained and deleted (kmock keeps no
        cluster.core.delete_namespaced_pod(name, "team-a")   # terminating pods: test_controller_decisions has those)
    assert ctl.reconcile() == []
    controller_deletes = [r for r in cluster.requests("DELETE", "pods") if r.data and "preconditions" in r.data]
    assert controller_deletes == []                  # the test's own deletes (what Kubernetes does) carry none
    assert not any(_quarantined(cluster, f"n{i}") for i in range(5))
    assert cluster.reasons() == []
    assert sample(reg, "rlfleet_controller_actions_total", action="delete_pod") == 0
    assert {"run1-trainer-0", "run1-trainer-1", "run1-rollout-c", "run1-rollout-d"} == set(cluster.pods())
