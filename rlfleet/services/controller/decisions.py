"""Pure decisions: from a snapshot of the run, which failures need a recovery, and what each recovery does."""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.services.controller.exit_rules import judge
from rlfleet.services.controller.objects import Pod, Snapshot

TRAINER = "trainer"
ROLLOUT = "rollout"

NODE_FAILURE = "node_failure"      # a node running a trainer rank is NotReady/Unknown
RANK_FAILURE = "rank_failure"      # a trainer rank's container failed (Failed phase, non-zero exit, crash loop);
                                   # its node is quarantined only for a node-level exit (exit_rules.py)
HUNG_RANK = "hung_rank"            # no trainer step past the deadline while batches are ready
DEAD_REPLICA = "dead_replica"      # a rollout replica failed, lost its node, or stayed not Ready too long


@dataclass(frozen=True)
class Failure:
    kind: str
    key: str                        # identifies this failure across controller restarts (no second recovery)
    reason: str                     # one line for Events and logs
    quarantine: tuple[str, ...]     # nodes to taint and label
    delete_pods: tuple[tuple[str, str], ...]   # (name, uid): pods to delete (the gang, or the dead replica)
    force: bool = False             # delete with grace 0 (the kubelet is gone)


def _rank_failed(pod: Pod) -> bool:
    return pod.phase == "Failed" or pod.crash_looping or (pod.failed_exit and not pod.ready)


def _gang(snap: Snapshot) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((p.name, p.uid) for p in snap.component(TRAINER) if not p.deleting))


def trainer_failures(snap: Snapshot) -> list[Failure]:
    """Node loss first (it explains a rank failure on that node), then failed ranks. One gang restart covers all."""
    live = [p for p in snap.component(TRAINER) if not p.deleting]
    lost_nodes = sorted({p.node for p in live if p.node and p.node in snap.nodes and not snap.nodes[p.node].ready})
    if lost_nodes:
        uids = ",".join(sorted(p.uid for p in live if p.node in lost_nodes))
        return [Failure(NODE_FAILURE, f"{NODE_FAILURE}:{'+'.join(lost_nodes)}:{uids}",
                        f"node {', '.join(lost_nodes)} not ready under trainer rank(s)", tuple(lost_nodes),
                        _gang(snap), force=True)]
    failed = sorted((p for p in live if _rank_failed(p)), key=lambda p: p.name)
    if failed:
        # Only a node-level exit (a faulty device, SIGBUS) quarantines; an application's exit restarts the gang.
        verdicts = {p.name: judge(p.exits) for p in failed}
        nodes = tuple(sorted({p.node for p in failed if p.node and verdicts[p.name][0].node_fault}))
        names = ", ".join(f"{p.name} ({verdicts[p.name][1]})" for p in failed)
        return [Failure(RANK_FAILURE, f"{RANK_FAILURE}:{','.join(p.uid for p in failed)}",
                        f"trainer rank(s) {names} failed", nodes, _gang(snap))]
    return []


def hung_failure(snap: Snapshot, step: int | None, suspects: list[str]) -> Failure:
    by_name = {p.name: p for p in snap.component(TRAINER)}
    not_ready = [p.name for p in by_name.values() if not p.ready and not p.deleting]
    blamed = suspects or not_ready
    nodes = tuple(sorted({node for n in blamed if n in by_name and (node := by_name[n].node)}))
    who = f"; suspect rank(s) {', '.join(blamed)}" if blamed else "; no rank to blame (gang restart only)"
    return Failure(HUNG_RANK, f"{HUNG_RANK}:step{step}:{','.join(u for _, u in _gang(snap))}",
                   f"trainer made no step past {step}{who}", nodes, _gang(snap))


def replica_failures(snap: Snapshot, dead_after: float) -> list[Failure]:
    out = []
    for p in snap.component(ROLLOUT):
        if p.deleting:
            continue
        node_lost = bool(p.node and p.node in snap.nodes and not snap.nodes[p.node].ready)
        since = p.ready_changed_at or p.created_at
        stuck = not p.ready and since is not None and snap.now - since >= dead_after
        if p.phase == "Failed" or p.crash_looping or node_lost or stuck:
            why = ("node lost" if node_lost else "failed" if p.phase == "Failed" else
                   "crash loop" if p.crash_looping else f"not ready for {dead_after:.0f}s")
            out.append(Failure(DEAD_REPLICA, f"{DEAD_REPLICA}:{p.uid}", f"rollout replica {p.name}: {why}", (),
                               ((p.name, p.uid),), force=node_lost))
    return out
