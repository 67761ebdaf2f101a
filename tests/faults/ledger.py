"""The fault harness's ledger and checker (Jepsen's method: record what clients saw, then check it).

The ledger records, per sample id (`group/index`): when a Put carrying it was acknowledged, which steps delivered
it, which committed step records (the trainer's checkpoints) trained it, and the samples the buffer dropped by
reason (its Stats). It also records every fault: its kind, when it was injected, when it ended (restart, SIGCONT,
space back), when the buffer next served (thread mode: the first reply the store's work backs, to a call made after
the injection), when the run next made progress (a step committed after the fault ended), and whether damage it
did to the store's files (a torn record, a torn AOF command) was reported (a warning or error in the buffer's or
redis-server's log). check() is written from the ledger alone.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Fault:
    kind: str
    injected: float
    ended: float = 0.0
    recovered: float = 0.0          # the first step committed after `ended` (0: never)
    serving: float = 0.0            # the first reply backed by the store to a call made after `injected` (0: never)
    damage: str = ""                # what it did to the store's files that the store must notice ("": nothing)
    reported: bool = False          # that damage appeared as a warning or error in a log


@dataclass
class Ledger:
    put: dict[str, float] = field(default_factory=dict)                 # sample id -> first acknowledgement
    tickets: set[str] = field(default_factory=set)                      # group ids Claim handed out
    delivered: dict[int, list[str]] = field(default_factory=dict)       # step -> sample ids of its batch
    trained: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))   # id -> committed steps
    committed: dict[int, float] = field(default_factory=dict)           # step -> when its record was written
    dropped: dict[str, int] = field(default_factory=dict)               # reason -> samples (buffer Stats)
    stored_at_end: set[str] = field(default_factory=set)                # ids still in the store at the end
    dropped_ids: dict[str, str] | None = None     # id -> drop reason, where the store's records name ids (run mode)
    faults: list[Fault] = field(default_factory=list)
    acks: set[int] = field(default_factory=set)                         # steps whose Ack the buffer answered
    notes: list[str] = field(default_factory=list)                      # e.g. a batch whose ids changed
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked(self, ids: list[str]) -> None:
        now = time.monotonic()
        with self.lock:
            for i in ids:
                self.put.setdefault(i, now)

    def commit(self, step: int, ids: list[str]) -> None:
        with self.lock:
            self.committed[step] = time.monotonic()
            for i in ids:
                self.trained[i].append(step)
            for f in self.faults:
                if f.ended and not f.recovered:
                    f.recovered = self.committed[step]

    def served(self, started: float) -> None:
        """A call made at `started` got a reply the store's work backs (a Put acknowledged, a complete batch, an
        Ack, a Claim with tickets): every fault injected before that call is served again."""
        now = time.monotonic()
        with self.lock:
            for f in self.faults:
                if not f.serving and f.injected <= started:
                    f.serving = now

    def trained_from(self, records: dict[int, list[str]], steps: int) -> list[str]:
        """Replace `trained` with what the committed step records say; the problem when they are not steps
        0..steps-1 (empty when they are)."""
        self.trained.clear()
        for step, ids in records.items():
            for i in ids:
                self.trained[i].append(step)
        if sorted(records) != list(range(steps)):
            return [f"committed steps {sorted(records)}, expected 0..{steps - 1}"]
        return []

    def fault(self, kind: str) -> Fault:
        f = Fault(kind, time.monotonic())
        with self.lock:
            self.faults.append(f)
        return f


def next_step(f: Fault, committed: list[float]) -> float:
    """When the first step was committed once the fault was over: after it ended and the buffer served again (a
    trainer may write a step record while the buffer is down: that step is not the recovery); for a fault the run
    rode through (no step after it ended, some while it was in force), the first step after its injection. 0: none."""
    after = max(f.ended, f.serving)
    return min((t for t in committed if t >= after), default=0.0) or min(
        (t for t in committed if t >= f.injected), default=0.0)


@dataclass(frozen=True)
class Verdict:
    lost: list[str]              # acknowledged, never trained, not in the store at the end, not counted dropped
    trained_twice: list[str]
    unexpected: list[str]        # trained but never acknowledged by a Put (or a batch that changed on redelivery)
    put: int
    trained: int
    dropped: dict[str, int]
    recovered: dict[str, int]    # fault kind -> faults after which the run made progress again
    unrecovered: dict[str, int]
    recovery_s: dict[str, list[float]]   # fault kind -> seconds from the fault's end to the next committed step
    serving_s: dict[str, list[float]] = field(default_factory=dict)   # kind -> seconds from injection to serving
    step_s: dict[str, list[float]] = field(default_factory=dict)      # kind -> injection to next_step()
    silent: dict[str, int] = field(default_factory=dict)      # kind -> faults whose damage no log reported
    damaged: dict[str, int] = field(default_factory=dict)     # kind -> faults that damaged the store's files

    @property
    def ok(self) -> bool:
        return not (self.lost or self.trained_twice or self.unexpected) and not any(self.unrecovered.values())

    def line(self) -> str:
        rec = ", ".join(f"{k} {self.recovered.get(k, 0)}/{self.recovered.get(k, 0) + self.unrecovered.get(k, 0)}"
                        for k in sorted({*self.recovered, *self.unrecovered}))
        return (f"put {self.put} trained {self.trained} dropped {self.dropped or {}}: lost {len(self.lost)}, "
                f"trained twice {len(self.trained_twice)}, unexpected {len(self.unexpected)}, "
                f"silent {sum(self.silent.values())}; recovered {rec}")


def check(ledger: Ledger) -> Verdict:
    put, trained = set(ledger.put), set(ledger.trained)
    twice = sorted(i for i, steps in ledger.trained.items() if len(steps) > 1)
    unexpected = sorted(trained - put) + ledger.notes
    missing = put - trained - ledger.stored_at_end
    if ledger.dropped_ids is not None:       # drops known per id: every missing id must have been dropped
        lost = sorted(missing - set(ledger.dropped_ids))
    else:
        # the buffer's Stats name drops by reason, not by id: missing ids are covered by drops up to their count
        allowed = sum(n for reason, n in ledger.dropped.items() if reason != "duplicate")
        lost = sorted(missing) if len(missing) > allowed else []
    recovered: dict[str, int] = defaultdict(int)
    unrecovered: dict[str, int] = defaultdict(int)
    times: dict[str, list[float]] = defaultdict(list)
    serving: dict[str, list[float]] = defaultdict(list)
    step: dict[str, list[float]] = defaultdict(list)
    silent: dict[str, int] = defaultdict(int)
    damaged: dict[str, int] = defaultdict(int)
    last = max(ledger.committed.values(), default=0.0)
    for f in ledger.faults:
        if f.serving:
            serving[f.kind].append(f.serving - f.injected)
        if (f.recovered or f.ended and last >= f.injected) and next_step(f, list(ledger.committed.values())):
            step[f.kind].append(next_step(f, list(ledger.committed.values())) - f.injected)
        if f.damage:
            damaged[f.kind] += 1
            silent[f.kind] += not f.reported
        if f.recovered:
            recovered[f.kind] += 1
            times[f.kind].append(f.recovered - (f.ended or f.injected))
        elif f.ended and last >= f.injected:
            # steps went on being committed while the fault was in force (a buffer that rides out a full disk)
            # and the last of them came before it ended: the run never stopped, nothing to recover
            recovered[f.kind] += 1
            times[f.kind].append(0.0)
        else:
            unrecovered[f.kind] += 1
    return Verdict(lost, twice, unexpected, len(put), len(trained), dict(ledger.dropped), dict(recovered),
                   dict(unrecovered), dict(times), dict(serving), dict(step), dict(silent), dict(damaged))


def summarize(verdicts: list[Verdict]) -> str:
    """Totals over runs, and recovery time p50 / max per fault kind."""
    lost = sum(len(v.lost) for v in verdicts)
    twice = sum(len(v.trained_twice) for v in verdicts)
    unexpected = sum(len(v.unexpected) for v in verdicts)
    lines = [f"{len(verdicts)} runs: lost {lost}, trained twice {twice}, unexpected {unexpected}; "
             f"{sum(v.put for v in verdicts)} samples put, {sum(v.trained for v in verdicts)} trained"]
    kinds = sorted({k for v in verdicts for k in (*v.recovered, *v.unrecovered)})
    for kind in kinds:
        ts = [t for v in verdicts for t in v.recovery_s.get(kind, [])]
        n_ok = sum(v.recovered.get(kind, 0) for v in verdicts)
        n_all = n_ok + sum(v.unrecovered.get(kind, 0) for v in verdicts)
        span = f"p50 {statistics.median(ts):.2f} s, max {max(ts):.2f} s" if ts else "no recovery times"
        from_fault = ""
        for name, by_kind in (("serving", "serving_s"), ("next step", "step_s")):
            xs = [t for v in verdicts for t in getattr(v, by_kind).get(kind, [])]
            if xs:
                from_fault += f"; {name} p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s"
        lines.append(f"  {kind:<16} recovered {n_ok}/{n_all}; recovery {span}{from_fault}")
    return "\n".join(lines)
