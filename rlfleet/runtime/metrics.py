"""Prometheus metrics each service exports, and the JSONL metrics log of a run.

Every metric name lives here, so dashboards and alert rules (deploy/helm/rlfleet) have one place to check.
Each service builds its own CollectorRegistry (no process-global registry) and serves it on --metrics-port.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        labels = {"replica": replica}
        self.generated_tokens = Counter("rlfleet_rollout_generated_tokens", "Response tokens generated",
                                        ["replica"], registry=registry).labels(**labels)
        self._samples = Counter("rlfleet_rollout_samples", "Finished samples by status", ["replica", "status"],
                                registry=registry)
        self.replica = replica
        self.queue_depth = Gauge("rlfleet_rollout_queue_depth", "Generation requests waiting or running",
                                 ["replica"], registry=registry).labels(**labels)
        self.weight_version = Gauge("rlfleet_rollout_weight_version", "Weight version this replica serves",
                                    ["replica"], registry=registry).labels(**labels)
        self.reward = Histogram("rlfleet_rollout_reward", "Reward of finished samples", ["replica"],
                                buckets=(-1, 0, 0.25, 0.5, 0.75, 1, 2, 5), registry=registry).labels(**labels)

    def sample_finished(self, status: str) -> None:
        self._samples.labels(replica=self.replica, status=status).inc()


class BufferMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge("rlfleet_buffer_depth", "Samples stored and not yet delivered", registry=registry)
        self.ready_groups = Gauge("rlfleet_buffer_ready_groups", "Complete groups ready for the trainer",
                                  registry=registry)
        self.capacity = Gauge("rlfleet_buffer_capacity", "Samples the buffer holds before back-pressure",
                              registry=registry)
        self.tickets_in_flight = Gauge("rlfleet_buffer_tickets_in_flight", "Groups claimed by rollout, not yet put",
                                       registry=registry)
        self.put = Counter("rlfleet_buffer_put_samples", "Samples accepted", registry=registry)
        self.put_refused = Counter("rlfleet_buffer_put_refused_samples", "Put calls refused for a sample, by the "
                                   "sample's replica and reason (max_seq_len, too_large, invalid)",
                                   ["replica", "reason"], registry=registry)
        self.delivered = Counter("rlfleet_buffer_delivered_samples", "Samples delivered to the trainer",
                                 registry=registry)
        self.acked = Counter("rlfleet_buffer_acked_samples", "Samples acknowledged after a committed step",
                             registry=registry)
        self.dropped = Counter("rlfleet_buffer_dropped_samples", "Samples dropped, by reason", ["reason"],
                               registry=registry)
        self.staleness = Histogram("rlfleet_buffer_staleness_versions", "policy version - sample version at delivery",
                                   buckets=(0, 1, 2, 3, 4, 8, 16), registry=registry)
        self.policy_version = Gauge("rlfleet_buffer_policy_version", "Latest version the trainer reported",
                                    registry=registry)
        self.dropped_log_records = Counter("rlfleet_buffer_dropped_log_records",
                                           "Metrics log records that could not be written (a full disk): dropped",
                                           registry=registry)


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.step = Gauge("rlfleet_trainer_step", "Optimizer steps committed", registry=registry)
        self.last_step_time = Gauge("rlfleet_trainer_last_step_timestamp_seconds", "Unix time of the last step",
                                    registry=registry)
        self.step_seconds = Histogram("rlfleet_trainer_step_seconds", "Wall time of one step (excluding waits)",
                                      buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300), registry=registry)
        self.batch_wait_seconds = Histogram("rlfleet_trainer_batch_wait_seconds", "Time waiting for a batch",
                                            buckets=(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300), registry=registry)
        self.loss = Gauge("rlfleet_trainer_loss", "Loss of the last step", registry=registry)
        self.reward = Gauge("rlfleet_trainer_reward_mean", "Mean reward of the last batch", registry=registry)
        self.tis_ratio = Gauge("rlfleet_trainer_tis_ratio_mean", "Mean train/rollout importance ratio",
                               registry=registry)
        self.tis_clip = Gauge("rlfleet_trainer_tis_clip_fraction", "Fraction of tokens whose IS weight was clipped",
                              registry=registry)
        self.logprob_diff = Gauge("rlfleet_trainer_logprob_abs_diff", "Mean |train - rollout| logprob",
                                  registry=registry)
        self.weight_version = Gauge("rlfleet_trainer_weight_version", "Latest published weight version",
                                    registry=registry)


class WeightSyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.update_seconds = Histogram("rlfleet_weight_sync_seconds", "Publish to replica ack, per transport",
                                        ["transport"], buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
                                        registry=registry)
        self.bytes = Counter("rlfleet_weight_sync_bytes", "Bytes moved to replicas, per transport", ["transport"],
                             registry=registry)
        self.failures = Counter("rlfleet_weight_sync_failures", "Failed replica updates", ["replica"],
                                registry=registry)
        self.published_version = Gauge("rlfleet_weight_sync_published_version", "Latest published version",
                                       registry=registry)
        self.replica_version = Gauge("rlfleet_weight_sync_replica_version", "Version each replica acknowledged",
                                     ["replica"], registry=registry)


class ControllerMetrics:
    """The on-call controller (rlfleet/services/controller): recoveries, the API actions they took, leadership,
    watches."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.recoveries = Counter("rlfleet_controller_recoveries", "Recoveries by failure kind and outcome",
                                  ["kind", "outcome"], registry=registry)
        self.actions = Counter("rlfleet_controller_actions", "Kubernetes API actions taken, by action",
                               ["action"], registry=registry)
        self.recoveries_in_progress = Gauge("rlfleet_controller_recoveries_in_progress",
                                            "Recoveries started and not finished", registry=registry)
        self.quarantined_nodes = Gauge("rlfleet_controller_quarantined_nodes", "Nodes this run has quarantined",
                                       registry=registry)
        self.is_leader = Gauge("rlfleet_controller_is_leader", "1 while this controller holds the Lease",
                               registry=registry)
        self.relists = Counter("rlfleet_controller_watch_relists", "Full re-lists after a watch expired (410 Gone)",
                               ["resource"], registry=registry)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> int:
    """Serve /metrics on port (0 = off). Returns the port."""
    if port:
        start_http_server(port, addr=addr, registry=registry)
    return port


class JsonlLog:
    """Append-only JSON-lines metrics log (one object per line, one write(2) each, O_APPEND).

    With `on_error`, a record that cannot be written (a full disk: ENOSPC, or EFBIG past RLIMIT_FSIZE) is dropped
    and counted (`dropped`, and on_error(exc) is called: a service counts it as a metric) instead of raising: a
    metrics log never takes a service down. A write cut short leaves a torn line; the next record starts on a new
    line, and read_jsonl skips the torn one. Without on_error the error is raised, as before."""

    def __init__(self, path: Path, on_error: Callable[[OSError], None] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._on_error = on_error
        self._torn = False           # the last write may have left part of a line
        self.dropped = 0             # records not written

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": time.time(), **record}, allow_nan=False, default=float)
        with self._lock:
            data = (("\n" if self._torn else "") + line + "\n").encode()
            try:
                done = 0
                while done < len(data):
                    done += os.write(self._fd, data[done:])
            except OSError as exc:
                self._torn = True
                if self._on_error is None:
                    raise
                self.dropped += 1
                self._on_error(exc)
            else:
                self._torn = False

    def close(self) -> None:
        os.close(self._fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of a killed writer
    return out
