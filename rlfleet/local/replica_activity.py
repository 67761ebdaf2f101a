"""Which rollout replicas generated nothing lately: the progress line's `idle: rollout-1` marker.

Each replica writes a record to RUN_DIR/metrics/rollout-<i>.jsonl every 5 s (rlfleet/services/rollout/
throughput_log.py) with the tokens it generated in that interval (tokens_per_s x interval_s). A replica is idle when
its records cover the last `window` seconds and those intervals hold no generated token, while another replica's do:
when no replica generated, all wait on the trainer, and that says nothing about one of them. The scale-time reason
(the buffer lets out too few groups for every replica) is rlfleet/local/scale_hint.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet.local.report import MetricsTail

IDLE_WINDOW_S = 15.0       # three of the replicas' 5 s metric intervals


def interval_tokens(record: Mapping[str, Any]) -> float:
    return float(record.get("tokens_per_s", 0.0)) * float(record.get("interval_s", 0.0))


def generated_over(records: Sequence[Mapping[str, Any]], window: float) -> float | None:
    """Tokens generated over the `window` seconds before the newest record; None when the records cover less."""
    if not records:
        return None
    since = float(records[-1]["time"]) - window
    if float(records[0]["time"]) > since:
        return None                                  # too young to say
    return sum(interval_tokens(r) for r in records if float(r["time"]) > since)


def idle_replicas(records: Mapping[str, Sequence[Mapping[str, Any]]], window: float = IDLE_WINDOW_S) -> list[str]:
    """Replicas (by name, in replica order) that generated nothing over the window while another one generated."""
    generated = {name: generated_over(recs, window) for name, recs in records.items()}
    if not any(g for g in generated.values()):
        return []
    return sorted((name for name, g in generated.items() if g == 0), key=replica_order)


def replica_order(name: str) -> tuple[int, str]:
    index = name.rsplit("-", 1)[-1]
    return (int(index), name) if index.isdigit() else (1 << 30, name)


class ReplicaActivity:
    """Follows the metrics files of the replicas a run has now and names the idle ones (idle_replicas)."""

    def __init__(self, metrics_dir: Path, window: float = IDLE_WINDOW_S) -> None:
        self.metrics_dir, self.window = metrics_dir, window
        self._tails: dict[str, MetricsTail] = {}
        self._records: dict[str, list[dict[str, Any]]] = {}

    def idle(self, replicas: Sequence[str]) -> list[str]:
        for name in replicas:
            tail = self._tails.setdefault(name, MetricsTail(self.metrics_dir / f"{name}.jsonl"))
            records = self._records.setdefault(name, [])
            records.extend(r for r in tail.read() if "time" in r)
            self._records[name] = self._keep(records)
        return idle_replicas({name: self._records[name] for name in replicas}, self.window)

    def _keep(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records inside the window, and the newest one before it (it shows the window is covered)."""
        if not records:
            return records
        since = float(records[-1]["time"]) - self.window
        older = [i for i, r in enumerate(records) if float(r["time"]) <= since]
        return records[older[-1]:] if older else records
