"""Trainer progress: what the hung-rank decision reads (step, batches ready, per-rank last step time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class TrainerProgress:
    step: int | None                         # rank 0's committed step (None: not reachable)
    ready_groups: int | None                 # the buffer's complete groups ready for the trainer
    groups_per_step: int = 1
    finished: bool = False
    rank_last_step: dict[str, float | None] = field(default_factory=dict)   # pod -> unix time of its last step


class ProgressSource(Protocol):
    def read(self, trainer_pods: list[tuple[str, str | None]]) -> TrainerProgress:
        """trainer_pods: (pod name, pod IP). Never raises: unknown facts are None."""
        ...


class HungTracker:
    """Remembers when the trainer's step last changed; the trainer is hung when it has not for `hung_after`
    seconds while the buffer has a full batch ready (a starved trainer is the buffer alert's business)."""

    def __init__(self, hung_after: float) -> None:
        self.hung_after = hung_after
        self._step: int | None = None
        self._since: float | None = None

    def observe(self, progress: TrainerProgress, now: float) -> bool:
        if progress.step is None or progress.finished:
            return False
        if progress.step != self._step or self._since is None:
            self._step, self._since = progress.step, now
            return False
        starved = progress.ready_groups is not None and progress.ready_groups < progress.groups_per_step
        return not starved and now - self._since >= self.hung_after

    @property
    def step(self) -> int | None:
        return self._step

    def reset(self, now: float) -> None:
        self._since = now


def suspect_ranks(progress: TrainerProgress, now: float, hung_after: float) -> list[str]:
    """Ranks to blame for a hang: those whose own last step is stale while another rank's is fresh. A rank that
    exports no step time (today only rank 0 serves metrics) is unknown, not a suspect."""
    times = progress.rank_last_step
    fresh = [t for t in times.values() if t is not None and now - t < hung_after]
    if not fresh:
        return []
    return sorted(pod for pod, t in times.items() if t is not None and now - t >= hung_after)
