"""The buffer section: store, grouping, staleness, filters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.config.section import Section


class BufferConfig(Section):
    """The buffer: where samples wait between rollout and trainer, and the rules that issue and drop groups."""

    store: Literal["embedded", "redis"] = Field("embedded", description="Where samples are kept: an append-only "
                                                "log in the run folder, or Redis Streams.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="The Redis server of store: redis.")
    redis_durability: Literal["always", "everysec_loses_1s", "unchecked_may_lose_writes"] = Field(
        "always", description="What store: redis requires of the Redis server's persistence, checked with CONFIG GET "
        "when the buffer starts. always: appendonly yes and appendfsync always (each acknowledged write is fsynced "
        "before Redis replies), else the buffer refuses to start. everysec_loses_1s: also accepts appendfsync "
        "everysec, with a warning (a power loss of the Redis host loses up to ~1 s of acknowledged samples, "
        "deliveries and acks). unchecked_may_lose_writes: accepts any setting (appendfsync no, no AOF at all), "
        "with a warning. Where CONFIG is denied (some managed Redis services) appendfsync cannot be read: "
        "the buffer checks that the AOF is on (INFO persistence) and warns.")
    capacity: int = Field(1024, ge=1, description="Samples held (stored + in flight) before back-pressure.")
    max_staleness: int = Field(0, ge=0, description="0: synchronous RL; k: samples may lag k weight versions.")
    lease_seconds: float = Field(300.0, gt=0, description="A ticket whose samples do not all arrive within this "
                                 "many seconds is re-queued (and a cancelled group is remembered this long).")
    filters: list[str] = Field([], description="Group filters: built-in names (dynamic_sampling) or dotted paths "
                               "to SampleFilters.")
    min_valid_per_group: int = Field(2, ge=1, description="A complete group with fewer valid (not failed or "
                                     "aborted) samples is dropped.")
    fsync: Literal["always", "everysec", "no"] = Field(
        "always", description="Embedded store durability. always: a reply waits for its commit's fsync (group "
        "commit: concurrent calls share one). everysec: loses up to ~1 s of acknowledged samples, deliveries and "
        "acks on power loss. no: loses whatever the OS had not written back on power loss. (A process crash loses "
        "nothing under any of them.)")
    over_sample: float = Field(1.0, ge=1.0, le=16.0, description="Issue up to ceil(over_sample * "
                               "trainer.groups_per_step) groups per step (DAPO over-sampling); when a step's batch "
                               "is full, groups in flight that the staleness bound no longer lets feed a step are "
                               "cancelled.")
