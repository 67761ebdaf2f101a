"""Progress of a phase that can take more than a few seconds (a held-out evaluation, a warm start, a GGUF
conversion): done/total, rate and ETA.

A phase run by the launcher's own process (model.prepare, a GGUF conversion) prints its line on the console
(`stream`); a phase run inside a service (the trainer's evaluation) writes its state to a small JSON file
(`path`, in RUN_DIR/progress/) that the launcher reads and prints (rlfleet/local/report.py `PhaseFiles`). Both
render the same `ProgressState.line()`:

    evaluation before training: 64/100 prompts (64%), 3.1 prompts/s, ETA 12s
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from rlfleet.run_dir.atomic import write_text_atomic

PROGRESS_DIR = "progress"          # RUN_DIR/progress/<phase key>.json


def format_seconds(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class ProgressState:
    """One phase's progress at one moment. total 0: unknown (a phase with stages only shows elapsed time)."""

    phase: str
    done: float
    total: float
    unit: str
    elapsed: float                    # seconds since the phase began
    finished: bool = False
    started_at: float = 0.0           # wall clock (time.time()) when the phase began: tells two runs of a phase apart
    detail: str = ""                  # a short note the phase adds (e.g. "probe 0.22")

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far; None before the first unit is done or when the total is unknown."""
        if self.finished:
            return 0.0
        if self.total <= 0 or self.done <= 0:
            return None
        return (self.total - self.done) / self.rate

    def line(self) -> str:
        text = self._line()
        return f"{text}; {self.detail}" if self.detail else text

    def _line(self) -> str:
        if self.finished:
            rate = f", {self.rate:.1f} {self.unit}/s" if self.total > 0 and self.elapsed > 0 else ""
            count = ("done" if self.total <= 0
                     else f"{self.done:g}/{self.total:g} {self.unit}" if self.done >= self.total
                     else f"{self.done:g} {self.unit} (of at most {self.total:g})")
            return f"{self.phase}: {count} in {format_seconds(self.elapsed)}{rate}"
        if self.total <= 0:
            return f"{self.phase}: {format_seconds(self.elapsed)} so far"
        pct = 100.0 * self.done / self.total
        eta = self.eta
        return (f"{self.phase}: {self.done:g}/{self.total:g} {self.unit} ({pct:.0f}%), {self.rate:.1f} {self.unit}/s, "
                f"ETA {'?' if eta is None else format_seconds(eta)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProgressState:
        data = json.loads(text)
        return cls(phase=str(data["phase"]), done=float(data["done"]), total=float(data["total"]),
                   unit=str(data["unit"]), elapsed=float(data["elapsed"]), finished=bool(data.get("finished")),
                   started_at=float(data.get("started_at", 0.0)), detail=str(data.get("detail", "")))


class _Stderr:
    """The default stream: sys.stderr when the reporter is made (not when this module was imported)."""


STDERR = _Stderr()


class PhaseProgress:
    """Reports one phase. `advance(n)` / `update(done)` as work completes, `finish()` at the end (or use it as a
    context manager). Lines go to `stream` (None: no console) at most every `every` seconds, plus the first and the
    last; on a terminal the line is rewritten in place. `path`: the state file the launcher reads (written on each
    report, atomically)."""

    def __init__(self, phase: str, total: float, unit: str, stream: TextIO | None | _Stderr = STDERR,
                 path: Path | None = None, every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, detail: str = "") -> None:
        self.phase, self.total, self.unit = phase, float(total), unit
        self.stream = sys.stderr if isinstance(stream, _Stderr) else stream    # sys.stderr as it is now
        self.path, self.every, self.clock = path, every, clock
        self.tty = bool(self.stream is not None and self.stream.isatty())
        self.done = 0.0
        self.detail = detail
        self.finished = False
        self._start = clock()
        self._started_at = time.time()
        self._last = float("-inf")
        self._lock = threading.Lock()
        self._report(force=True)

    def state(self) -> ProgressState:
        return ProgressState(self.phase, self.done, self.total, self.unit, self.clock() - self._start, self.finished,
                             self._started_at, self.detail)

    def advance(self, n: float = 1.0) -> None:
        with self._lock:
            self.done += n
        self._report()

    def update(self, done: float, detail: str | None = None) -> None:
        """`detail`: a new note (a new stage) is reported at once."""
        with self._lock:
            self.done = float(done)
            changed = detail is not None and detail != self.detail
            if detail is not None:
                self.detail = detail
        self._report(force=changed)

    def finish(self, done: float | None = None) -> None:
        """The phase is over (`done`: its final count, else the count so far): one last line."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            if done is not None:
                self.done = float(done)
        self._report(force=True)
        if self.tty and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """Report the elapsed time every `every` seconds while the block runs (a step with no inner progress, such as
        loading a file with a library that reports nothing)."""
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(self.every):
                self._report(force=True)

        thread = threading.Thread(target=tick, name=f"progress-{self.phase}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _report(self, force: bool = False) -> None:
        now = self.clock()
        with self._lock:
            due = force or self.tty or now - self._last >= self.every or self.done >= self.total > 0
            if not due:
                return
            self._last = now
            state = self.state()
            if self.path is not None:
                write_text_atomic(self.path, state.to_json())
            if self.stream is not None:
                line = state.line()
                self.stream.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
                self.stream.flush()


def phase_file(run_dir: Path, key: str) -> Path:
    """The state file of phase `key` (e.g. "eval") in a run folder."""
    return Path(run_dir) / PROGRESS_DIR / f"{key}.json"


def read_phase_files(run_dir: Path) -> dict[str, ProgressState]:
    """Every phase's last state in RUN_DIR/progress/, by key; a file being replaced is skipped (read next time)."""
    out: dict[str, ProgressState] = {}
    folder = Path(run_dir) / PROGRESS_DIR
    if not folder.is_dir():
        return out
    for f in sorted(folder.glob("*.json")):
        try:
            out[f.stem] = ProgressState.from_json(f.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
