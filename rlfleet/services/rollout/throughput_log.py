"""Periodic JSONL records of a replica's throughput (RUN_DIR/metrics/rollout-<id>.jsonl), mirrored to Prometheus."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from rlfleet.runtime.metrics import JsonlLog, RolloutMetrics
from rlfleet.services.rollout.engines.base import Engine


class ThroughputLog:
    def __init__(self, path: Path, replica_id: str, engine: Engine, metrics: RolloutMetrics,
                 in_flight_groups: Callable[[], int], interval: float = 5.0) -> None:
        self._log = JsonlLog(path)
        self._replica, self._engine, self._metrics = replica_id, engine, metrics
        self._in_flight_groups = in_flight_groups
        self._interval = interval
        self._last_tokens, self._last_time = 0, time.monotonic()
        self.finished_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="throughput-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def record(self) -> None:
        stats = self._engine.stats()
        now = time.monotonic()
        tokens = stats.generated_tokens - self._last_tokens
        seconds = max(now - self._last_time, 1e-9)
        self._last_tokens, self._last_time = stats.generated_tokens, now
        self._metrics.generated_tokens.inc(tokens)
        self._metrics.queue_depth.set(stats.running + stats.waiting)
        self._metrics.weight_version.set(self._engine.weight_version)
        self._log.write({"service": "rollout", "replica": self._replica, "weight_version": self._engine.weight_version,
                         "generated_tokens": stats.generated_tokens, "tokens_per_s": tokens / seconds,
                         "interval_s": seconds, "running": stats.running, "waiting": stats.waiting,
                         "finished_samples": self.finished_samples, "in_flight_groups": self._in_flight_groups()})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.record()
        self._log.close()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.record()
