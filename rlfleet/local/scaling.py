"""Scaling a live local run: `rlfleet scale RUN_DIR rollout=N` asks, the launcher of that run acts and reports.

The two talk through two small files in the run folder, each written atomically:
  scale.json          the request: {"rollout": N, "id": "<unique>"}; written by `rlfleet scale`
  replicas.json       the launcher's answer: {"request": "<id>", "desired": N, "running": [...], "leaving": [...]}
A new replica registers with the buffer and weight sync by itself (its first Claim, its Subscribe gets the current
version); a removed replica is sent SIGTERM and drains: it stops claiming, finishes its groups for up to
`rollout.drain_seconds`, then hands the rest back to the buffer (re-queued at once, not at lease expiry) and exits.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlfleet.run_dir.atomic import write_text_atomic

REQUEST_FILE = "scale.json"
STATUS_FILE = "replicas.json"
MAX_REPLICAS = 64


class ScaleError(ValueError):
    """A scale request that cannot be carried out, or a run that did not carry it out in time."""


@dataclass(frozen=True)
class ScaleRequest:
    rollout: int
    id: str


@dataclass(frozen=True)
class ReplicaStatus:
    request: str
    desired: int
    running: tuple[str, ...]
    leaving: tuple[str, ...]

    @property
    def settled(self) -> bool:
        return not self.leaving and len(self.running) == self.desired


def parse_target(text: str) -> int:
    """'rollout=3' -> 3."""
    name, sep, value = text.partition("=")
    if name != "rollout" or not sep:
        raise ScaleError(f"'{text}': expected rollout=N (only rollout replicas scale independently)")
    try:
        n = int(value)
    except ValueError:
        raise ScaleError(f"'{text}': N must be an integer") from None
    if not 1 <= n <= MAX_REPLICAS:
        raise ScaleError(f"'{text}': N must be between 1 and {MAX_REPLICAS}")
    return n


def write_request(run_dir: Path, rollout: int) -> ScaleRequest:
    req = ScaleRequest(rollout=rollout, id=uuid.uuid4().hex)
    write_text_atomic(run_dir / REQUEST_FILE, json.dumps({"rollout": req.rollout, "id": req.id}))
    return req


def read_request(run_dir: Path) -> ScaleRequest | None:
    """The newest request, or None (no file, or one being replaced: the atomic rename makes a torn read rare,
    and a request that cannot be read now is read on the next poll)."""
    try:
        data = json.loads((run_dir / REQUEST_FILE).read_text())
        return ScaleRequest(rollout=int(data["rollout"]), id=str(data["id"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_status(run_dir: Path, status: ReplicaStatus) -> None:
    write_text_atomic(run_dir / STATUS_FILE, json.dumps({"request": status.request, "desired": status.desired,
                                                         "running": list(status.running),
                                                         "leaving": list(status.leaving)}, indent=2))


def read_status(run_dir: Path) -> ReplicaStatus | None:
    try:
        data = json.loads((run_dir / STATUS_FILE).read_text())
        return ReplicaStatus(request=str(data["request"]), desired=int(data["desired"]),
                             running=tuple(data["running"]), leaving=tuple(data["leaving"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def started_replicas(run_dir: Path) -> int:
    """rollout.replicas of the run's resolved config: the replicas it started with."""
    try:
        data = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
        return int(data["rollout"]["replicas"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        raise ScaleError(f"{run_dir} has no readable config.resolved.yaml: is it a run folder?") from None


def scale(run_dir: Path, target: str, timeout: float = 300.0, poll: float = 0.25) -> ReplicaStatus:
    """Ask the run in `run_dir` for `target` replicas and wait until its launcher reports them settled."""
    if not (run_dir / "processes.json").exists():
        raise ScaleError(f"{run_dir} is not the folder of a live run (no processes.json)")
    n = parse_target(target)
    started = started_replicas(run_dir)
    if n < started:
        raise ScaleError(f"rollout={n}: the run started with {started} replicas, which serve its held-out "
                         f"evaluation and stay; scale between {started} and {MAX_REPLICAS}")
    req = write_request(run_dir, n)
    deadline = time.monotonic() + timeout
    while True:
        status = read_status(run_dir)
        if status is not None and status.request == req.id and status.settled:
            return status
        if time.monotonic() > deadline:
            raise ScaleError(f"the run in {run_dir} did not reach rollout={req.rollout} within {timeout:.0f}s "
                             f"(last status: {status})")
        time.sleep(poll)


def scale_hint(run_dir: Path, replicas: int) -> str | None:
    """rlfleet/local/scale_hint.py's sentence for the run in `run_dir` at `replicas` replicas (None: all can work, or
    the run's config cannot be read)."""
    from rlfleet.config import ConfigError, load_config
    from rlfleet.local.scale_hint import idle_replicas_hint

    try:
        cfg = load_config(run_dir / "config.resolved.yaml")
    except ConfigError:
        return None
    return idle_replicas_hint(cfg, replicas)
