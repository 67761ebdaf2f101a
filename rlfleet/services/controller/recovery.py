"""Carries one recovery to its end, step by step, saving each step before the next: a controller that restarts
mid-recovery reads the record and finishes it, repeating no step (quarantine and deletes are idempotent too)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from rlfleet.runtime.metrics import ControllerMetrics
from rlfleet.services.controller.decisions import DEAD_REPLICA, TRAINER, Failure
from rlfleet.services.controller.events import EventRecorder
from rlfleet.services.controller.kube import Kube
from rlfleet.services.controller.objects import Snapshot
from rlfleet.services.controller.store import DONE, FAILED, IN_PROGRESS, Recovery, RecoveryStore

log = logging.getLogger("rlfleet.controller")


def recovery_id(failure: Failure) -> str:
    return f"{failure.kind.replace('_', '-')}-{hashlib.sha256(failure.key.encode()).hexdigest()[:12]}"


class RecoveryRunner:
    def __init__(self, kube: Kube, events: EventRecorder, store: RecoveryStore, metrics: ControllerMetrics,
                 quarantine_taint: str, timeout: float,
                 tickets_in_flight: Callable[[], int | None] | None = None) -> None:
        self.kube = kube
        self.events = events
        self.store = store
        self.metrics = metrics
        self.taint = quarantine_taint
        self.timeout = timeout
        self.tickets_in_flight = tickets_in_flight

    def start(self, failure: Failure, now: float) -> Recovery:
        rec = Recovery(id=recovery_id(failure), kind=failure.kind, key=failure.key, reason=failure.reason,
                       quarantine=list(failure.quarantine), delete_pods=[list(p) for p in failure.delete_pods],
                       force=failure.force, started_at=now)
        self.store.save(rec)
        log.warning("recovery %s started: %s", rec.id, rec.reason)
        self.metrics.recoveries.labels(kind=rec.kind, outcome="started").inc()
        subject = rec.delete_pods[0][0] if rec.delete_pods else self.kube.selector
        self.events.record(f"{rec.id}/started", "Pod", subject, "RecoveryStarted",
                           f"{rec.kind}: {rec.reason} (recovery {rec.id})", warning=True)
        return rec

    def advance(self, rec: Recovery, snap: Snapshot) -> None:
        if rec.status != IN_PROGRESS:
            return
        for node in rec.quarantine:
            if node in rec.quarantined:
                continue
            if self.kube.quarantine(node, self.taint, f"{rec.kind}: {rec.reason}"):
                self.metrics.actions.labels(action="quarantine_node").inc()
            self.events.record(f"{rec.id}/quarantine/{node}", "Node", node, "NodeQuarantined",
                               f"tainted and labelled {self.taint} ({rec.kind}, recovery {rec.id})",
                               warning=True, namespaced=False)
            rec.quarantined.append(node)
            self.store.save(rec)
        for name, uid in rec.delete_pods:
            if uid in rec.deleted:
                continue
            if rec.kind == DEAD_REPLICA and self.tickets_in_flight is not None:
                tickets = self.tickets_in_flight()
                rec.note = (f"buffer had {tickets} tickets in flight; the dead replica's re-queue when their lease "
                            "expires (buffer.lease_seconds)") if tickets is not None else rec.note
            if self.kube.delete_pod(name, uid, force=rec.force):
                self.metrics.actions.labels(action="delete_pod").inc()
            self.events.record(f"{rec.id}/delete/{uid}", "Pod", name, "PodDeleted",
                               f"deleted for {rec.kind} (recovery {rec.id}); its controller replaces it")
            rec.deleted.append(uid)
            self.store.save(rec)
        if self._finished(rec, snap):
            self._close(rec, DONE, snap.now, "RecoveryFinished", self._done_message(rec))
        elif snap.now - rec.started_at > self.timeout:
            self._close(rec, FAILED, snap.now, "RecoveryFailed",
                        f"{rec.kind} not recovered within {self.timeout:.0f}s (recovery {rec.id})")

    def _finished(self, rec: Recovery, snap: Snapshot) -> bool:
        old = {uid for _, uid in rec.delete_pods}
        if any(p.uid in old for p in snap.pods):
            return False
        if rec.kind == DEAD_REPLICA:
            return True
        ranks = [p for p in snap.component(TRAINER) if not p.deleting]
        return len(ranks) >= len(rec.delete_pods) and all(p.ready for p in ranks)

    def _done_message(self, rec: Recovery) -> str:
        if rec.kind == DEAD_REPLICA:
            return f"replica replaced; {rec.note or 'its in-flight groups re-queue when their buffer lease expires'}"
        return (f"trainer gang restarted ({len(rec.delete_pods)} ranks Ready) and resumes from its last checkpoint"
                f"; quarantined: {', '.join(rec.quarantined) or 'none'}")

    def _close(self, rec: Recovery, status: str, now: float, reason: str, message: str) -> None:
        rec.status, rec.finished_at = status, now
        self.store.save(rec)
        self.metrics.recoveries.labels(kind=rec.kind, outcome=status).inc()
        log.warning("recovery %s %s: %s", rec.id, status, message)
        subject = rec.delete_pods[0][0] if rec.delete_pods else self.kube.selector
        self.events.record(f"{rec.id}/{status}", "Pod", subject, reason, f"{message} (recovery {rec.id})",
                           warning=status == FAILED)
