"""A played run of the rendered chart: render, play, operate on it as users do, wait for the end, judge the ledger.

Operations (each an event whose recovery is timed, injected in order as committed steps pass their turn):
  scale             re-render with rollout.replicas 2 and apply (a new replica started), later 1 again (stopped
                    gracefully): two events, scale-up and scale-down
  kill-buffer       `podman kill -s KILL` the buffer's container; the kubelet's part (restartPolicy Always) starts
                    it again
  kill-rollout      the same for a rollout replica
  restart-trainer   the trainer's pod deleted (SIGTERM, grace period) and made again under its name, as its
                    StatefulSet does: it resumes from its last checkpoint
  partition         `podman network disconnect` of a rollout pod for longer than the buffer's lease, then connect
Recovery per event: from the fault to the pod serving again (its readiness probe passes), and to the next step
committed after it (a complete checkpoint in the run volume). The ledger is the fault harness's
(tests/faults/ledger.py), built from durable evidence only (tests/faults/evidence.py): every sample id the Redis
AOF holds an XADD for, the committed ids of every complete checkpoint, the store's drops and what it still holds.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet.local.report import format_summary, summarize
from tests.cluster.chart import merge, render
from tests.cluster.play.issuer import PlayIssuer
from tests.cluster.play.plan import Plan, Pod, existing_secrets, make_plan
from tests.cluster.play.podman import Player, PodmanError, volume_path
from tests.cluster.play.secrets import make_existing_secrets
from tests.faults.evidence import complete_steps, load_state, redis_put_ids, stored_ids
from tests.faults.ledger import Fault, Ledger, Verdict, check
from tests.faults.run_mode import committed, completed_at

OPS = ("scale", "kill-buffer", "kill-rollout", "restart-trainer", "partition")
# under security.existingSecrets every replica has one identity and the chart refuses a second replica: scale needs
# cert-manager's per-replica certificates (played by the adapter's CA: --set security.existingSecrets=null ...)
DEFAULT_OPS = ("kill-buffer", "kill-rollout", "restart-trainer", "partition")


@dataclass
class Event:
    kind: str
    at_step: int
    fault: Fault
    pod: str = ""
    note: str = ""


@dataclass
class Outcome:
    verdict: Verdict
    events: list[Event]
    wall_s: float
    summary: dict[str, Any]
    not_enforced: list[str]
    not_played: list[str]
    lines: list[str] = field(default_factory=list)


class PlayedRun:
    def __init__(self, values: dict[str, Any], work: Path, release: str = "add1", namespace: str = "play",
                 log: Callable[[str], None] = print) -> None:
        self.values = values
        self.work = work
        self.release = release
        self.namespace = namespace
        self.log = log
        self.player = Player(work)
        self.issuer = PlayIssuer()                  # cert-manager's part, where the values ask cert-manager
        self.ledger = Ledger()
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.plan = Plan(release, namespace, "", "")
        self.finished_trainer = False
        self.started = time.monotonic()

    # -- rendering --------------------------------------------------------------------------------------------
    def render(self, overrides: dict[str, Any] | None = None) -> Plan:
        values = merge(self.values, overrides or {})
        objects = render(values, release=self.release, namespace=self.namespace)
        ips = {p.name: p.ip for p in self.plan.pods.values()}
        return make_plan(objects, self.release, self.namespace, existing_secrets(self.work / "secrets"), ips=ips,
                         issuer=self.issuer, keep=self.plan.kept_secrets)

    @property
    def run_name(self) -> str:
        return str(self.values["runConfig"]["run"]["name"])

    def run_dir(self) -> Path:
        claim = next(v for v in self.plan.volumes if v.endswith("-checkpoints"))
        return volume_path(self.player.volume_name(self.plan, claim)) / "runs" / self.run_name

    def pods(self, component: str) -> list[Pod]:
        return [p for p in self.plan.pods.values() if p.labels.get("app.kubernetes.io/component") == component]

    # -- the run ----------------------------------------------------------------------------------------------
    def up(self) -> None:
        if self.values.get("security", {}).get("existingSecrets"):
            made = make_existing_secrets(self.work / "secrets", self.values, self.release, self.namespace)
            self.log(f"Secrets made with a run CA (as `kubectl create secret generic` holds them): {', '.join(made)}")
        self.plan = self.render()
        for line in self.plan.not_played + self.plan.not_enforced:
            self.log(f"  {line}")
        self.started = time.monotonic()
        self.player.up(self.plan)
        took = self.player.wait_ready(list(self.plan.pods.values()), timeout=900.0, tick=self.kubelet)
        self.log(f"{time.monotonic() - self.started:7.1f}s every pod ready ({took:.0f} s)")

    def steps(self) -> dict[int, list[str]]:
        return complete_steps(self.run_dir())

    def trainer_done(self) -> bool:
        pods = self.pods("trainer")
        return bool(pods) and all(self.player.completed(p) for p in pods)

    def watch(self, total_steps: int, ops: list[tuple[int, str]], stall_s: float) -> None:
        """Until the trainer exits 0 with every step committed: record committed steps, restart exited pods (the
        kubelet), inject the next operation (in a thread: the watch goes on meanwhile)."""
        seen: set[int] = set()
        progress = time.monotonic()
        worker: threading.Thread | None = None
        while True:
            run_dir = self.run_dir()
            for step in sorted(set(self.steps()) - seen):
                seen.add(step)
                committed(self.ledger, step, completed_at(run_dir, step), {})
                progress = time.monotonic()
            if self.trainer_done() and seen >= set(range(total_steps)):
                break
            self.kubelet()
            if ops and (worker is None or not worker.is_alive()) and max(seen, default=-1) >= ops[0][0]:
                at, op = ops.pop(0)
                worker = threading.Thread(target=self.operate, args=(op, at), daemon=True)
                worker.start()
            if time.monotonic() - progress > stall_s:
                raise PodmanError(f"no step committed for {stall_s:.0f} s (steps so far {len(seen)}); logs: "
                                  + self.tails())
            time.sleep(0.3)
        if worker is not None:
            worker.join()
        if ops:
            self.log(f"not injected (the run ended first): {[op for _, op in ops]}")

    def kubelet(self) -> None:
        """restartPolicy Always for every pod but a trainer that finished the run (exit 0)."""
        with self.lock:
            trainer = {p.name for p in self.pods("trainer")}
            for name in self.player.restart_exited(self.plan, finished_ok=trainer):
                self.log(f"{self.elapsed()} {name} exited: started again (restartPolicy Always)")

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:7.1f}s"

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{self.player.logs(n, 25)}" for n in self.plan.pods)

    # -- operations -------------------------------------------------------------------------------------------
    def operate(self, op: str, at: int) -> None:
        try:
            getattr(self, "op_" + op.replace("-", "_"))(at)
        except Exception as exc:  # noqa: BLE001 - reported with the event list; the run goes on
            self.log(f"{self.elapsed()} {op} failed: {exc}")
            self.ledger.notes.append(f"{op}: {exc}")

    def event(self, kind: str, at: int, pod: str) -> Event:
        done = max(self.ledger.committed, default=-1)
        e = Event(kind, done, self.ledger.fault(kind), pod)
        self.events.append(e)
        self.log(f"{self.elapsed()} {kind} {pod} (due after step {at}; {done + 1} steps committed)")
        return e

    def serving(self, e: Event, pods: list[Pod], timeout: float = 600.0) -> None:
        self.player.wait_ready(pods, timeout=timeout, period=0.5)
        e.fault.serving = time.monotonic()
        self.log(f"{self.elapsed()} {e.kind}: serving again after {e.fault.serving - e.fault.injected:.1f} s")

    def op_kill_buffer(self, at: int) -> None:
        self._kill(self.pods("buffer")[0], "kill-buffer", at)

    def op_kill_rollout(self, at: int) -> None:
        self._kill(self.pods("rollout")[-1], "kill-rollout", at)

    def _kill(self, pod: Pod, kind: str, at: int) -> None:
        e = self.event(kind, at, pod.name)
        self.player.kill(pod.name, "KILL")
        e.fault.ended = time.monotonic()
        self.serving(e, [pod])

    def op_restart_trainer(self, at: int) -> None:
        pod = self.pods("trainer")[0]
        e = self.event("restart-trainer", at, pod.name)
        with self.lock:                       # the watch must not restart it while it is being deleted
            self.player.delete(pod)
            self.player.start(self.plan, pod)
        e.fault.ended = time.monotonic()
        self.serving(e, [pod])

    def op_partition(self, at: int) -> None:
        pod = self.pods("rollout")[0]
        lease = float(self.values["runConfig"].get("buffer", {}).get("lease_seconds", 60.0))
        e = self.event("partition", at, pod.name)
        self.player.disconnect(self.plan, pod)
        time.sleep(lease + 5.0)
        self.player.reconnect(self.plan, pod)
        e.fault.ended = time.monotonic()
        e.note = f"cut off for {e.fault.ended - e.fault.injected:.1f} s (lease {lease:.0f} s)"
        self.serving(e, [pod])

    def op_scale(self, at: int) -> None:
        for kind, n in (("scale-up", 2), ("scale-down", 1)):
            new = self.render({"rollout": {"replicas": n}})
            e = self.event(kind, at, f"rollout.replicas={n}")
            with self.lock:
                changes = self.player.apply(self.plan, new)
                self.plan = new
            e.fault.ended = time.monotonic()
            e.note = f"started {changes.started}, stopped {changes.stopped}"
            self.log(f"{self.elapsed()} {kind}: {e.note}")
            self.serving(e, [new.pods[n] for n in changes.started])
            if n == 2:                        # let the two replicas work together for a few steps
                target = len(self.steps()) + 3
                deadline = time.monotonic() + 300.0
                while len(self.steps()) < target and time.monotonic() < deadline:
                    time.sleep(1.0)

    # -- the verdict ------------------------------------------------------------------------------------------
    def judge(self, total_steps: int) -> Verdict:
        redis = self.pods("redis")[0]
        password = redis.main.env["REDIS_PASSWORD"]
        url = f"redis://buffer:{urllib.parse.quote(password, safe='')}@{redis.ip}:6379/0"
        prefix = f"rlfleet:{self.run_name}:buffer"
        state = load_state(self.run_dir(), url, prefix)
        self.ledger.dropped = dict(state.dropped)
        self.ledger.stored_at_end = stored_ids(state)
        aof = volume_path(self.player.volume_name(self.plan, next(v for v in self.plan.volumes
                                                                     if v.startswith("aof-"))))
        self.ledger.put = dict.fromkeys(redis_put_ids(aof, f"{prefix}:samples"), 0.0)
        self.ledger.notes.extend(self.ledger.trained_from(self.steps(), total_steps))
        return check(self.ledger)


def schedule(ops: list[str], steps: int) -> list[tuple[int, str]]:
    """Operations spread over the first 60% of the run (the rest is the runway their recovery needs)."""
    return [(max(1, (i + 1) * int(steps * 0.6) // (len(ops) + 1)), op) for i, op in enumerate(ops)]


def play(values: dict[str, Any], work: Path, ops: list[str], log: Callable[[str], None] = print,
         stall_s: float = 600.0, keep: bool = False) -> Outcome:
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"unknown operations {unknown} (known: {', '.join(OPS)})")
    values = copy.deepcopy(values)
    total = int(values["runConfig"]["trainer"]["steps"])
    run = PlayedRun(values, work, log=log)
    try:
        run.up()
        run.watch(total, schedule(ops, total), stall_s)
        wall = time.monotonic() - run.started
        verdict = run.judge(total)
        summary = summarize(run.run_dir() / "metrics" / "trainer.jsonl", wall, None)
        lines = [format_summary(summary, Path(f"(volume) runs/{run.run_name}")), "ledger: " + verdict.line()]
        events = []
        for e in run.events:
            f = e.fault
            nxt = min((t for t in run.ledger.committed.values() if t >= max(f.ended, f.serving)), default=0.0)
            events.append({"kind": e.kind, "pod": e.pod, "at_step": e.at_step, "note": e.note,
                           "serving_s": round(f.serving - f.injected, 1) if f.serving else None,
                           "next_step_s": round(nxt - f.injected, 1) if nxt else None})
            lines.append(f"  {e.kind:<16} {e.pod:<28} at step {e.at_step:>3}: serving again after "
                         f"{events[-1]['serving_s']} s, next trained step after {events[-1]['next_step_s']} s "
                         f"{e.note}")
        for line in lines:
            log(line)
        (work / "outcome.json").write_text(json.dumps({
            "wall_s": round(wall, 1), "summary": summary, "ledger": verdict.line(), "lost": len(verdict.lost),
            "trained_twice": len(verdict.trained_twice), "unexpected": verdict.unexpected, "put": verdict.put,
            "trained": verdict.trained, "dropped": verdict.dropped, "unrecovered": verdict.unrecovered,
            "events": events, "steps": sorted(run.ledger.committed)}, indent=1, default=str))
        return Outcome(verdict, run.events, wall, summary, run.plan.not_enforced, run.plan.not_played, lines)
    finally:
        if run.plan.network:
            run.player.down(run.plan, volumes=not keep, logs=work / "logs")
