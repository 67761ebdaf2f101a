"""The staleness gate's arithmetic: which trainer step a new group feeds, and the weight version that step needs.

Steps already delivered took `groups_per_step` groups each. Groups still pending (ready or in flight) are dealt to
the next steps `per_step = ceil(over_sample * groups_per_step)` at a time, so up to per_step groups are issued for a
step up front; what a step does not use stays pending and counts towards the next step's share. With over_sample 1
this is the plain count `live // groups_per_step`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    groups_per_step: int
    per_step: int            # groups issued per step up front: ceil(over_sample * groups_per_step)
    publish_every: int
    max_staleness: int

    @classmethod
    def of(cls, groups_per_step: int, over_sample: float, publish_every: int, max_staleness: int) -> Gate:
        per_step = max(groups_per_step, math.ceil(over_sample * groups_per_step - 1e-9))
        return cls(groups_per_step, per_step, publish_every, max_staleness)

    @property
    def over_samples(self) -> bool:
        """More groups are issued per step than it uses (the surplus is cancelled when no step can use it)."""
        return self.per_step > self.groups_per_step

    def step_of(self, delivered: int, pending: int) -> int:
        """The step the next issued group feeds, given groups delivered to steps and groups pending before it."""
        # delivered groups are scaled to per_step units: (delivered + pending) // gps when per_step == gps
        return (delivered * self.per_step // self.groups_per_step + pending) // self.per_step

    def version_needed(self, step: int) -> int:
        """The oldest weight version a group for `step` may be made with (it trains under step // publish_every)."""
        return step // self.publish_every - self.max_staleness
