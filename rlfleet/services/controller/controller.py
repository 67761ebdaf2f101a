"""One reconcile pass: finish the recoveries in progress, then start one for each new failure."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rlfleet.runtime.metrics import ControllerMetrics
from rlfleet.services.controller.decisions import (
    DEAD_REPLICA,
    TRAINER,
    Failure,
    hung_failure,
    replica_failures,
    trainer_failures,
)
from rlfleet.services.controller.kube import Kube
from rlfleet.services.controller.objects import Snapshot
from rlfleet.services.controller.progress import HungTracker, ProgressSource, suspect_ranks
from rlfleet.services.controller.recovery import RecoveryRunner
from rlfleet.services.controller.settings import Settings
from rlfleet.services.controller.store import IN_PROGRESS, RecoveryStore

log = logging.getLogger("rlfleet.controller")


class Controller:
    def __init__(self, settings: Settings, kube: Kube, store: RecoveryStore, runner: RecoveryRunner,
                 progress: ProgressSource | None, metrics: ControllerMetrics, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.kube = kube
        self.store = store
        self.runner = runner
        self.progress = progress
        self.metrics = metrics
        self.clock = clock
        self.hung = HungTracker(settings.hung_after)

    def reconcile(self) -> list[str]:
        """Returns the ids of recoveries started in this pass."""
        snap = self.kube.snapshot(self.clock())
        records = self.store.load()
        for rec in records.values():
            if rec.status == IN_PROGRESS:
                self.runner.advance(rec, snap)
        trainer_busy = any(r.status == IN_PROGRESS and r.kind != DEAD_REPLICA for r in records.values())
        failures: list[Failure] = []
        if not trainer_busy:
            failures += trainer_failures(snap) or self._hung(snap)
        failures += replica_failures(snap, self.settings.replica_dead_after)
        known = {r.key for r in records.values()}
        started = []
        for failure in failures:
            if failure.key in known:
                continue
            rec = self.runner.start(failure, snap.now)
            records[rec.id] = rec
            self.runner.advance(rec, snap)
            started.append(rec.id)
        self.metrics.recoveries_in_progress.set(sum(r.status == IN_PROGRESS for r in records.values()))
        self.metrics.quarantined_nodes.set(len({n for r in records.values() for n in r.quarantined}))
        return started

    def _hung(self, snap: Snapshot) -> list[Failure]:
        if self.progress is None:
            return []
        ranks = [p for p in snap.component(TRAINER) if not p.deleting]
        if not ranks:
            return []
        prog = self.progress.read([(p.name, p.ip) for p in ranks])
        if not self.hung.observe(prog, snap.now):
            return []
        self.hung.reset(snap.now)
        return [hung_failure(snap, prog.step, suspect_ranks(prog, snap.now, self.settings.hung_after))]
