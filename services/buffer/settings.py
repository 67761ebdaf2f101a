"""The numbers the buffer decides with, taken from the run config."""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.config import Config


@dataclass(frozen=True)
class BufferSettings:
    capacity: int = 1024
    max_staleness: int = 0
    lease_seconds: float = 300.0
    min_valid_per_group: int = 2
    group_size: int = 8
    groups_per_step: int = 8
    publish_every: int = 1
    steps: int = 100
    max_sample_bytes: int = 64 << 20
    over_sample: float = 1.0

    @classmethod
    def from_config(cls, cfg: Config, max_sample_bytes: int = 64 << 20) -> BufferSettings:
        b, t = cfg.buffer, cfg.trainer
        return cls(capacity=b.capacity, max_staleness=b.max_staleness, lease_seconds=b.lease_seconds,
                   min_valid_per_group=b.min_valid_per_group, group_size=cfg.rollout.group_size,
                   groups_per_step=t.groups_per_step, publish_every=t.publish_every, steps=t.steps,
                   max_sample_bytes=max_sample_bytes, over_sample=b.over_sample)
