"""torch.profiler Chrome traces for trainer.profile: one trace per profiled trainer step (`StepProfiler`) and per
profiled weight version of a torch engine's decode (`VersionProfiler`), written atomically under RUN_DIR/profile/.

The profiler records the ops of the thread that started it only, so each trace is started and stopped on the thread
that does the work: the trainer's main thread, the torch engine's scheduler thread. Open a trace in Perfetto
(https://ui.perfetto.dev) or chrome://tracing (docs/profiling.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rlfleet.config.profile import ProfileConfig
from rlfleet.run_dir.atomic import write_atomic

log = logging.getLogger(__name__)

PROFILE_DIR = "profile"          # RUN_DIR/profile/
ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}


def profile_dir(run_dir: Path) -> Path:
    return Path(run_dir) / PROFILE_DIR


def activities(names: Sequence[str] | None, device: torch.device) -> list[ProfilerActivity]:
    """The profiler activities of trainer.profile.activities (None: cpu, plus cuda on a CUDA device)."""
    if names is None:
        names = ["cpu", "cuda"] if device.type == "cuda" else ["cpu"]
    return [ACTIVITIES[n] for n in names]


def start_profiler(cfg: ProfileConfig, device: torch.device) -> profile:
    prof = profile(activities=activities(cfg.activities, device), record_shapes=cfg.record_shapes,
                   with_stack=cfg.with_stack, profile_memory=cfg.profile_memory)
    prof.start()
    return prof


def export_trace(prof: profile, path: Path) -> None:
    """Write prof's Chrome trace to path atomically (temp file, fsync, rename): a reader never sees half a trace."""
    write_atomic(path, lambda tmp: prof.export_chrome_trace(str(tmp)))
    log.info("profiler trace written: %s", path)


class StepProfiler:
    """The trainer's: `with profiler.step(n):` traces step n when trainer.profile.steps lists it, else does nothing.
    Each rank writes its own trace, trainer-step-N-rankR.json."""

    def __init__(self, cfg: ProfileConfig, run_dir: Path, rank: int, device: torch.device) -> None:
        self.cfg, self.rank, self.device = cfg, rank, device
        self.folder = profile_dir(run_dir)
        self.steps = frozenset(cfg.steps)

    def path(self, step: int) -> Path:
        return self.folder / f"trainer-step-{step}-rank{self.rank}.json"

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        if step not in self.steps:
            yield
            return
        prof = start_profiler(self.cfg, self.device)
        try:
            with record_function(f"rlfleet.trainer_step.{step}"):
                yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            prof.stop()
        export_trace(prof, self.path(step))


class VersionProfiler:
    """A torch engine's: call `before_step(version)` on the engine thread before each engine step and `close()` on it
    when the engine stops. The steps run under a profiled weight version are traced, up to cfg.rollout_steps per
    version, into NAME-vV.json; the trace is written when those steps are done, at the first step under another
    version, or at close."""

    def __init__(self, cfg: ProfileConfig, versions: Sequence[int], folder: Path, name: str,
                 device: torch.device) -> None:
        self.cfg, self.folder, self.name, self.device = cfg, Path(folder), name, device
        self.pending = set(versions)         # versions not traced yet
        self._open: tuple[int, profile] | None = None
        self._steps = 0

    def path(self, version: int) -> Path:
        return self.folder / f"{self.name}-v{version}.json"

    def before_step(self, version: int) -> None:
        if self._open is not None and (self._open[0] != version or self._steps >= self.cfg.rollout_steps):
            self._finish()
        if self._open is None and version in self.pending:
            self.pending.discard(version)
            self._open, self._steps = (version, start_profiler(self.cfg, self.device)), 0
        if self._open is not None:
            self._steps += 1

    def label(self, name: str) -> AbstractContextManager[object]:
        """A named range in the open trace (engine prefill / decode), nothing while no trace is open."""
        return record_function(name) if self._open is not None else nullcontext()

    def close(self) -> None:
        if self._open is not None:
            self._finish()

    def _finish(self) -> None:
        assert self._open is not None
        version, prof = self._open
        self._open = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prof.stop()
        export_trace(prof, self.path(version))
