"""The progress line names a rollout replica that generated nothing over the last window while another replica
generated (`idle: rollout-1`), read from the metrics files the replicas' own ThroughputLog writes; nothing is said
before the files cover a window, nor when every replica waits (on the trainer)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry

from rlfleet.local.replica_activity import ReplicaActivity
from rlfleet.local.report import Progress
from rlfleet.runtime.metrics import RolloutMetrics
from rlfleet.services.rollout.engines.base import Engine, EngineStats
from rlfleet.services.rollout.throughput_log import ThroughputLog

WINDOW = 0.4


class CountingEngine:
    """What ThroughputLog reads of an engine: cumulative generated tokens, raised by `per_record` before each look."""

    weight_version = 0

    def __init__(self, per_record: int) -> None:
        self.per_record, self.generated = per_record, 0

    def stats(self) -> EngineStats:
        self.generated += self.per_record
        return EngineStats(running=0, waiting=0, generated_tokens=self.generated, finished=0)


def test_the_replica_that_gets_no_work_is_named_on_the_progress_line(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    engines = {"rollout-0": CountingEngine(12), "rollout-1": CountingEngine(0)}
    logs = {name: ThroughputLog(metrics / f"{name}.jsonl", name, cast(Engine, engine),
                                RolloutMetrics(CollectorRegistry(), name), in_flight_groups=lambda: 0)
            for name, engine in engines.items()}
    for log in logs.values():
        log.start()                                   # its own 5 s records come after this test; close() joins it
    activity = ReplicaActivity(metrics, window=WINDOW)

    def record_all() -> None:
        for log in logs.values():
            log.record()

    record_all()
    assert activity.idle(list(logs)) == []                       # one record each: too young to say
    for _ in range(3):
        time.sleep(WINDOW / 2)
        record_all()
    idle = activity.idle(list(logs))
    assert idle == ["rollout-1"]
    assert activity.idle(["rollout-0"]) == []                    # a replica the run no longer has is not looked at

    out = io.StringIO()
    progress = Progress(8, stream=out, every=0.0)
    progress.update([{"step": 0, "loss": 0.1, "reward_mean": 0.5, "samples_per_s": 3.0}], idle=idle)
    progress.update([{"step": 1, "loss": 0.1, "reward_mean": 0.5, "samples_per_s": 3.0}])
    first, second = out.getvalue().splitlines()
    assert first.startswith("step 0 (1/8 done)") and first.endswith("  idle: rollout-1")
    assert "idle" not in second

    engines["rollout-0"].per_record = 0                          # now both wait (on the trainer): nothing to say
    for _ in range(3):
        time.sleep(WINDOW / 2)
        record_all()
    assert activity.idle(list(logs)) == []
    for log in logs.values():
        log.close()
