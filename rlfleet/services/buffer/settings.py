"""The numbers the buffer decides with, taken from the run config (whose models hold the defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rlfleet.config import BufferConfig, Config, RolloutConfig, TrainerConfig

MAX_SAMPLE_BYTES = 64 << 20


def _default(section: type[BaseModel], name: str) -> Any:
    return section.model_fields[name].default


@dataclass(frozen=True)
class BufferSettings:
    capacity: int = _default(BufferConfig, "capacity")
    max_staleness: int = _default(BufferConfig, "max_staleness")
    lease_seconds: float = _default(BufferConfig, "lease_seconds")
    min_valid_per_group: int = _default(BufferConfig, "min_valid_per_group")
    group_size: int = _default(RolloutConfig, "group_size")
    groups_per_step: int = _default(TrainerConfig, "groups_per_step")
    publish_every: int = _default(TrainerConfig, "publish_every")
    steps: int = _default(TrainerConfig, "steps")
    max_sample_bytes: int = MAX_SAMPLE_BYTES
    over_sample: float = _default(BufferConfig, "over_sample")
    replicas: int = _default(RolloutConfig, "replicas")
    claim_groups: int = _default(RolloutConfig, "claim_groups")

    def fair_share(self, per_step: int) -> int | None:
        """The most unexpired tickets one replica may hold (None: one replica, no cap): its share of the groups
        the staleness gate lets out at once (per_step * (max_staleness + 1) * publish_every), and never less than
        rollout.claim_groups, which is all a replica's work loop ever asks to hold."""
        if self.replicas <= 1:
            return None
        window = per_step * (self.max_staleness + 1) * self.publish_every
        return max(self.claim_groups, -(-window // self.replicas))

    @classmethod
    def from_config(cls, cfg: Config, max_sample_bytes: int = MAX_SAMPLE_BYTES) -> BufferSettings:
        b, t = cfg.buffer, cfg.trainer
        return cls(capacity=b.capacity, max_staleness=b.max_staleness, lease_seconds=b.lease_seconds,
                   min_valid_per_group=b.min_valid_per_group, group_size=cfg.rollout.group_size,
                   groups_per_step=t.groups_per_step, publish_every=t.publish_every, steps=t.steps,
                   max_sample_bytes=max_sample_bytes, over_sample=b.over_sample, replicas=cfg.rollout.replicas,
                   claim_groups=cfg.rollout.claim_groups)
