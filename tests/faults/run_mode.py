"""The fault harness's run mode: the real `rlfleet run` launcher and its service processes under seeded faults.

One seed: a tiny random llama (tests/support/tiny_model.py) on the addition example, 2 rollout replicas, one trainer
rank, a checkpoint every step (each a committed step record) and none deleted. The harness starts `rlfleet run`, and
each time the run makes progress past a fault's scheduled step (plus a seeded delay) injects it into the service
process named in RUN_DIR/processes.json (checked to be a child of the current launcher before any signal):
  replica_kill9  SIGKILL a rollout replica: the launcher restarts it (its groups are re-queued)
  replica_stop   SIGSTOP a rollout replica for 0.5-3 s, then SIGCONT
  trainer_kill9  SIGKILL trainer-0; buffer_kill9, weight_sync_kill9 likewise: the launcher stops the run (exit
                 non-zero) and the harness resumes it with `rlfleet run ... --resume`, as a user or the controller would
  trainer_stop, buffer_stop, weight_sync_stop   SIGSTOP for 0.5-3 s, then SIGCONT
  redis_kill9    (store redis) SIGKILL the harness's redis-server and start it again on its AOF (appendfsync always)
  redis_stop     (store redis) SIGSTOP redis-server for 0.5-3 s
  power_loss     (store embedded) the node loses power: the launcher and every service SIGSTOPped, then all
                 SIGKILLed at once (trainer-0 may be mid-checkpoint, the buffer mid-commit); then the buffer's log
                 gets what a power loss may leave after its last fsync: nothing, a torn prefix of one more commit
                 frame, or zeros (a tail the filesystem extended but never wrote); the run is resumed
  buffer_disk_full, trainer_disk_full   the disk fills for 1-2.5 s: writes past a file's current size fail for
                 that process (RLIMIT_FSIZE of the live process: the buffer's log, trainer-0's checkpoints)
A run that exits non-zero (for whatever reason: the fault, or a replica out of restarts) is resumed, up to
faults + 2 times; a launcher that makes no progress for `stall_s` is a finding (wedged) and is stopped.
The ledger is built from durable evidence only (tests.faults.evidence): the store's history of puts, the complete
checkpoints' committed ids, the store's drops (per sample id from the embedded log's records; by count for Redis)
and what it still holds; tests.faults.ledger.check judges it.
Recovery time: from the fault (SIGKILL, or SIGCONT for a stop) to the next checkpoint the harness sees complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlfleet.services.buffer.stores.embedded import LOG_NAME
from rlfleet.services.buffer.stores.logfile import HEADER_BYTES, scan_bytes
from tests.faults.disk_full import fill_disk_for, log_end
from tests.faults.evidence import (
    complete_steps,
    embedded_dropped_ids,
    embedded_put_ids,
    load_state,
    redis_put_ids,
    stored_ids,
)
from tests.faults.ledger import Fault, Ledger, Verdict, check
from tests.support.redis_server import RedisServer
from tests.support.runs import EXAMPLE, ROOT, rlfleet_cmd

SERVICE_FAULTS = ("replica_kill9", "replica_stop", "trainer_kill9", "trainer_stop", "buffer_kill9", "buffer_stop",
                  "weight_sync_kill9", "weight_sync_stop")
REDIS_FAULTS = ("redis_kill9", "redis_stop")
EMBEDDED_FAULTS = ("power_loss", "buffer_disk_full", "trainer_disk_full")
RUN_ENDING = ("trainer_kill9", "buffer_kill9", "weight_sync_kill9", "power_loss")   # the run stops: resumed
RUN_NAME = "faults"


@dataclass(frozen=True)
class Planned:
    at_step: int           # injected once a checkpoint of this step (or later) is complete ...
    delay: float           # ... plus this many seconds
    kind: str
    seconds: float         # how long a stop lasts
    which: int             # which replica (rollout-<which % replicas>)


def schedule(seed: int, store: str, steps: int, faults: int, kinds: tuple[str, ...] | None = None) -> list[Planned]:
    rng = random.Random(seed)
    pool = kinds or (SERVICE_FAULTS + (REDIS_FAULTS if store == "redis" else EMBEDDED_FAULTS))
    # Faults fall in the first half of the run: the second half is the runway each needs to land while the run is
    # live and to show its recovery. Steps are paced by the machine (0.1 s each on a quiet 2-core one, seconds on
    # a loaded one), so a fault scheduled near the end could land after the last step on a fast machine.
    at = sorted(rng.sample(range(0, max(steps // 2, faults)), faults))
    return [Planned(a, rng.uniform(0.0, 0.3), rng.choice(pool), rng.uniform(0.5, 3.0), rng.randrange(2))
            for a in at]


def overrides(run_dir: Path, model: Path, steps: int, store: str, redis_url: str | None) -> dict[str, object]:
    o: dict[str, object] = {
        "run.name": RUN_NAME, "model.prepare": None, "trainer.steps": steps, "trainer.groups_per_step": 2,
        "rollout.group_size": 2, "rollout.replicas": 2, "rollout.claim_groups": 2, "buffer.capacity": 64,
        "buffer.lease_seconds": 20.0, "eval.every_steps": 0, "eval.max_prompts": 4, "trainer.checkpoint_every": 1,
        "trainer.keep_checkpoints": 100_000, "buffer.min_valid_per_group": 1}
    if store == "redis":
        o.update({"buffer.store": "redis", "buffer.redis_url": redis_url})
    return o


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid (/proc/PID/stat), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def _running(pid: int) -> bool:
    found = _state_and_parent(pid)
    return found is not None and found[0] not in ("Z", "X")     # a killed child not yet reaped: gone


def is_child(pid: int, parent: int) -> bool:
    """pid is alive and a child of parent (never signal a pid that a finished run left in processes.json)."""
    found = _state_and_parent(pid)
    return found is not None and found[0] not in ("Z", "X") and found[1] == parent


class Launcher:
    """One `rlfleet run` (or `--resume`) process, in its own session."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log.open("ab")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def pid_of(self, run_dir: Path, name: str) -> int | None:
        try:
            pids = json.loads((run_dir / "processes.json").read_text())
        except (OSError, ValueError):
            return None
        pid = pids.get(name)
        return pid if isinstance(pid, int) and is_child(pid, self.proc.pid) else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)      # the launcher stops its services
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def run_seed(seed: int, store: str, work: Path, steps: int = 24, faults: int = 3,
             kinds: tuple[str, ...] | None = None, stall_s: float = 180.0, model: Path | None = None
             ) -> tuple[Verdict, list[str]]:
    """One seeded run of the real services; returns the verdict and a log of what was injected. `model`: a tiny
    model folder to share between seeds (by default one is made in `work`)."""
    from tests.support.tiny_model import make_tiny_model

    model = model or work / "model"
    if not (model / "config.json").exists():
        make_tiny_model(model)
    redis = RedisServer(work / "redis").start() if store == "redis" else None
    try:
        return _drive(seed, store, work, model, steps, faults, kinds, stall_s, redis)
    finally:
        if redis is not None:
            redis.stop()


def _drive(seed: int, store: str, work: Path, model: Path, steps: int, faults: int, kinds: tuple[str, ...] | None,
           stall_s: float, redis: RedisServer | None) -> tuple[Verdict, list[str]]:
    run_dir = work / "run"
    ledger, events, errors = Ledger(), [], []
    not_before: dict[int, float] = {}     # id(fault) -> a run-ending fault recovers only on a step after this time
    plan = schedule(seed, store, steps, faults, kinds)
    base = rlfleet_cmd(EXAMPLE, run_dir, model, overrides(run_dir, model, steps, store,
                                                           redis.url if redis else None))
    started = time.monotonic()
    seen: set[int] = set()
    launches = 0
    launcher = Launcher(base, work / "launcher.log")
    progress = time.monotonic()
    try:
        while True:
            for step in sorted(set(complete_steps(run_dir)) - seen):
                seen.add(step)
                committed(ledger, step, completed_at(run_dir, step), not_before)
                progress = time.monotonic()
            code = launcher.proc.poll()
            if code is not None:
                launcher.stop()
                if code == 0 and seen >= set(range(steps)):
                    break
                if launches >= faults + 2:
                    errors.append(f"run still failing after {launches} resumes (last exit {code}); see {work}")
                    break
                launches += 1
                for f in ledger.faults:             # a checkpoint the dying run finished is no recovery
                    if f.kind in RUN_ENDING and not f.recovered:
                        not_before[id(f)] = min(not_before.get(id(f), float("inf")), time.monotonic())
                events.append(f"{time.monotonic() - started:6.2f}s run exited {code}: resume")
                launcher = Launcher([*base, "--resume"], work / "launcher.log")
                continue
            if time.monotonic() - progress > stall_s:
                errors.append(f"no step committed for {stall_s:.0f} s (wedged); see {work}")
                break
            if plan and max(seen, default=-1) >= plan[0].at_step:
                p = plan.pop(0)
                time.sleep(p.delay)
                events.append(f"{time.monotonic() - started:6.2f}s {inject(p, launcher, run_dir, redis, ledger)}")
                if p.kind in RUN_ENDING and ledger.faults and ledger.faults[-1].kind == p.kind:
                    not_before.setdefault(id(ledger.faults[-1]), float("inf"))
            time.sleep(0.1)
    finally:
        launcher.stop()
        last = max(ledger.committed.values(), default=0.0)
        for f in [f for f in ledger.faults if not f.recovered and len(ledger.committed) == steps
                  and f.ended > last]:           # landed after the last step: nothing left to recover
            ledger.faults.remove(f)
            events.append(f"{f.kind} landed after the last step (not counted)")
        if plan:
            events.append(f"not injected (the run ended first): {[p.kind for p in plan]}")
    prefix = f"rlfleet:{RUN_NAME}:buffer"
    state = load_state(run_dir, redis.url if redis else None, prefix)
    ledger.dropped = dict(state.dropped)
    ledger.stored_at_end = stored_ids(state)
    ledger.put = dict.fromkeys(redis_put_ids(redis.dir, f"{prefix}:samples") if redis
                               else embedded_put_ids(run_dir), 0.0)
    ledger.dropped_ids = None if redis else embedded_dropped_ids(run_dir)
    records = complete_steps(run_dir)
    errors.extend(ledger.trained_from(records, steps))
    ledger.notes.extend(errors)
    return check(ledger), events


def completed_at(run_dir: Path, step: int) -> float:
    """When a checkpoint was completed (its newest file's mtime), on the monotonic clock."""
    folder = run_dir / "checkpoints" / f"step_{step:08d}"
    times = []
    for f in folder.iterdir():
        try:
            times.append(f.stat().st_mtime)
        except OSError:                       # a temp file the trainer renamed meanwhile (e.g. the seal's)
            pass
    return max(times, default=time.time()) - time.time() + time.monotonic()


def committed(ledger: Ledger, step: int, when: float, not_before: dict[int, float]) -> None:
    """A checkpoint seen complete: each fault that ended before it and had not recovered recovers at `when` (a
    run-ending one only on a checkpoint of the resumed run)."""
    with ledger.lock:
        ledger.committed[step] = when
        for f in ledger.faults:
            if f.ended and not f.recovered and when > max(f.ended, not_before.get(id(f), 0.0)):
                f.recovered = when


def inject(p: Planned, launcher: Launcher, run_dir: Path, redis: RedisServer | None, ledger: Ledger) -> str:
    """Inject one planned fault; returns what was done."""
    if p.kind == "power_loss":
        return power_loss(p, launcher, run_dir, ledger)
    target = p.kind.removesuffix("_kill9").removesuffix("_stop").removesuffix("_disk_full")
    if target == "redis":
        assert redis is not None and redis.proc is not None
        pid: int | None = redis.proc.pid
    else:
        name = {"replica": f"rollout-{p.which}", "trainer": "trainer-0"}.get(target, target)
        pid = launcher.pid_of(run_dir, name)
        if pid is None:
            return f"{p.kind}: {name} not running (skipped)"
    assert pid is not None
    f = ledger.fault(p.kind)
    if p.kind.endswith("_kill9"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            ledger.faults.remove(f)
            return f"{p.kind}: pid {pid} exited just before (skipped)"
        f.ended = time.monotonic()
        if redis is not None and target == "redis":
            assert redis.proc is not None
            redis.proc.wait()
            redis.start()
        return f"{p.kind} pid {pid}"
    if p.kind.endswith("_disk_full"):
        return disk_full(p, pid, run_dir / "buffer" / LOG_NAME if target == "buffer" else None, f)
    try:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(p.seconds)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:            # the launcher stopped it meanwhile (the run ended for another fault)
        f.ended = time.monotonic()
        return f"{p.kind} pid {pid}: it exited while stopped"
    f.ended = time.monotonic()
    return f"{p.kind} pid {pid} for {p.seconds:.1f} s"


def disk_full(p: Planned, pid: int, grows: Path | None, f: Fault) -> str:
    """Writes past the end of the log `grows` (None: past 0 bytes, so no new file gets data) fail for `pid`, as on a
    full disk (EFBIG: Python ignores SIGXFSZ), for p.seconds / 1.2 (1-2.5 s); then space returns."""
    try:
        fill_disk_for(pid, log_end(grows) if grows is not None else 0, p.seconds / 1.2)
    except (ProcessLookupError, OSError) as exc:     # it exited meanwhile (e.g. the failed write ended the run)
        f.ended = time.monotonic()
        return f"{p.kind} pid {pid}: it exited while the disk was full ({type(exc).__name__})"
    f.ended = time.monotonic()
    return f"{p.kind} pid {pid} for {p.seconds / 1.2:.1f} s"


def power_loss(p: Planned, launcher: Launcher, run_dir: Path, ledger: Ledger) -> str:
    """The whole node stops at once (SIGSTOP of the launcher, then of its services; then SIGKILL of all), and the
    buffer's log keeps what a power loss may leave past its last fsync: nothing more, a torn prefix of one more
    frame, or zeros. Every reply the buffer sent followed its fsync, so nothing acknowledged is cut (thread mode,
    which sees the replies, also cuts back into unsynced commits)."""
    try:
        pids = json.loads((run_dir / "processes.json").read_text())
    except (OSError, ValueError):
        pids = {}
    children = [pid for pid in pids.values() if isinstance(pid, int) and is_child(pid, launcher.proc.pid)]
    f = ledger.fault(p.kind)
    for pid in [launcher.proc.pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    for pid in [launcher.proc.pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    launcher.proc.wait()
    for pid in children:                       # reparented when the launcher died: gone once not running
        while _running(pid):
            time.sleep(0.01)
    log = run_dir / "buffer" / LOG_NAME
    rng = random.Random(f"{p.at_step}:{p.delay}")
    data = log.read_bytes() if log.exists() else b""
    found = scan_bytes(log, data)
    choice = rng.choice(("clean", "torn", "zeros")) if found.frames else "clean"
    tail = b""
    if choice == "torn":
        offset, body = found.frames[-1]
        frame = data[offset:offset + HEADER_BYTES + len(body)]
        tail = frame[:rng.randrange(1, len(frame))]
    elif choice == "zeros":
        tail = b"\0" * rng.randrange(1, 4097)
    if tail:
        # after the last frame, over the zeros the buffer wrote ahead (the file keeps its size, as on disk)
        new = data[:found.end] + tail
        log.write_bytes(new + bytes(max(0, len(data) - len(new))))
    f.ended = time.monotonic()
    return f"power_loss: {1 + len(children)} processes killed at once; log tail {choice} (+{len(tail)} bytes)"


def main(args: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from tests.faults.ledger import summarize

    parser = argparse.ArgumentParser(description="seeded faults of the real services of `rlfleet run`")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--store", choices=["embedded", "redis", "both"], default="embedded")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--faults", type=int, default=3)
    parser.add_argument("--kinds", default=None,
                        help="comma-separated fault kinds to draw from (default: every kind the store allows)")
    parser.add_argument("--running-totals", action="store_true", help="print the totals after every seed")
    parser.add_argument("--keep", type=Path, default=None, help="keep each seed's work folder under this folder")
    ns = parser.parse_args(args)
    stores = ["embedded", "redis"] if ns.store == "both" else [ns.store]
    verdicts: dict[str, list[Verdict]] = {s: [] for s in stores}
    bad = 0
    shared = Path(tempfile.mkdtemp(prefix="rlfleet-faults-model-")) / "model"     # one tiny model for every seed
    for seed in range(ns.first_seed, ns.first_seed + ns.seeds):
        for store in stores:
            with tempfile.TemporaryDirectory() as tmp:
                work = ns.keep / f"{store}-{seed}" if ns.keep else Path(tmp)
                work.mkdir(parents=True, exist_ok=True)
                verdict, events = run_seed(seed, store, work, ns.steps, ns.faults, model=shared,
                                           kinds=tuple(ns.kinds.split(",")) if ns.kinds else None)
            verdicts[store].append(verdict)
            print(f"seed {seed} {store}: {verdict.line()}\n    " + "\n    ".join(events), flush=True)
            if not verdict.ok:
                bad += 1
                print(f"  FAILED: lost {verdict.lost[:5]} twice {verdict.trained_twice[:5]} "
                      f"unexpected {verdict.unexpected[:5]} unrecovered {verdict.unrecovered}", flush=True)
            if ns.running_totals:
                print(f"  so far [{store}] " + summarize(verdicts[store]).replace("\n", "\n  "), flush=True)
    for store in stores:
        print(f"[{store}] " + summarize(verdicts[store]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
