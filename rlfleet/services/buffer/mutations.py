"""The buffer's state changes as records: every store persists these, and State.apply replays them.

A record is a small JSON header plus, for a sample, its raw serialized Sample bytes as the payload. One record is
not a state change: Seq, the embedded log's commit number (rlfleet.services.buffer.stores.embedded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Issue:
    """A ticket issued (or re-issued after its lease expired) to a replica."""

    gid: str
    prompt_index: int
    group_size: int
    deadline: float          # wall-clock time the lease ends
    replica: str
    version: int = 0         # weight version the replica held when it claimed (decides a later cancellation)


@dataclass(frozen=True)
class Add:
    """One accepted sample; data is the serialized rlfleet.v1.Sample, never decoded here."""

    gid: str
    index: int
    seq: int                 # store-wide sequence number (the Redis stream id is 0-seq)
    weight_version: int
    status: int
    reward: float
    data: bytes = field(repr=False, default=b"")


@dataclass(frozen=True)
class Close:
    """A complete group: kept samples become ready (seq names its ready entry), the rest are dropped."""

    gid: str
    kept: tuple[int, ...]
    seq: int
    drops: dict[str, int]            # reason -> samples dropped
    drop_seqs: tuple[int, ...]       # sample seqs that leave the store


@dataclass(frozen=True)
class Stale:
    """Ready groups dropped at GetBatch: `stale` (a sample older than policy_version - max_staleness), or `aborted`
    (over-sampled groups left when the last step has its batch: no step can use them)."""

    gids: tuple[str, ...]
    ready_seqs: tuple[int, ...]
    sample_seqs: tuple[int, ...]
    samples: int
    reason: str = "stale"


@dataclass(frozen=True)
class Cancel:
    """An issued group no longer wanted (over-sampled, and too old for any step left): the ticket ends, the samples
    already put leave the store (dropped as aborted), and the group is remembered until `until` so the replica is told
    and its later puts are dropped as aborted too. `indices`: the indices counted as aborted so far."""

    gid: str
    until: float
    indices: tuple[int, ...]
    sample_seqs: tuple[int, ...]     # samples that leave the store (empty when replayed from a snapshot)
    reason: str = "aborted"          # what the samples that leave count as (`trained`: a checkpoint committed them)


@dataclass(frozen=True)
class Discard:
    """Samples put for a cancelled group: never stored, counted as dropped (aborted) once per index."""

    gid: str
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Refuse:
    """Samples not stored, counted as dropped for `reason` (e.g. `superseded_lease`: put under a lease the buffer
    had already re-issued to another replica, so they never displace the fresh holder's samples)."""

    reason: str
    samples: int


@dataclass(frozen=True)
class Forget:
    """Cancelled groups whose `until` has passed: no longer reported; a later put of theirs is a late duplicate."""

    gids: tuple[str, ...]


@dataclass(frozen=True)
class Deliver:
    """The batch for a trainer step: ready groups, oldest first."""

    step: int
    gids: tuple[str, ...]
    ready_seqs: tuple[int, ...]


@dataclass(frozen=True)
class AckSteps:
    """Every batch with step <= committed_step is acknowledged and leaves the store."""

    committed_step: int
    steps: tuple[int, ...]
    ready_seqs: tuple[int, ...]
    sample_seqs: tuple[int, ...]
    samples: int
    groups: int


@dataclass(frozen=True)
class Quarantine:
    """Groups of the batch for `step` the trainer rejected (Buffer.Reject): they leave the batch and the store (their
    samples count as dropped, `quarantined`) and are recorded with the trainer's reason, for good, so they are never
    delivered again. The batch's other groups go back to the ready queue under new ready seqs (`requeue_seqs`).
    Replayed from a snapshot it carries only the records: no batch, no seqs."""

    step: int
    gids: tuple[str, ...]
    reason: str
    ready_seqs: tuple[int, ...] = ()      # the quarantined groups' ready entries that leave
    sample_seqs: tuple[int, ...] = ()     # their samples, which leave the store
    samples: int = 0
    requeue: tuple[str, ...] = ()         # the batch's other groups, ready again
    requeue_seqs: tuple[int, ...] = ()    # their new ready seqs (the Redis ready-stream ids are 0-seq)


@dataclass(frozen=True)
class Policy:
    version: int


@dataclass(frozen=True)
class Counters:
    """Absolute counters and cursor: the last record of a snapshot."""

    next_prompt_index: int
    seq: int
    put_samples: int
    acked_samples: int
    acked_groups: int
    committed_step: int
    policy_version: int
    dropped: dict[str, int]
    cancelled_groups: int = 0


@dataclass(frozen=True)
class Seq:
    """Not a state change: a commit's number in the embedded store's log, the first record of each commit frame (0
    for a log's first commit, then one more a commit), so replay tells a repeated frame from the next one. Never
    reaches State.apply."""

    n: int


Mutation = (Issue | Add | Close | Stale | Cancel | Discard | Refuse | Forget | Deliver | AckSteps | Quarantine | Policy
            | Counters)
Record = Mutation | Seq      # what a log holds
_TYPES: dict[str, type] = {t.__name__: t for t in (Issue, Add, Close, Stale, Cancel, Discard, Refuse, Forget, Deliver,
                                                   AckSteps, Quarantine, Policy, Counters, Seq)}
# Header field names per type, in declaration order ("data" travels as the payload). Every field is a str, number,
# tuple or flat dict, so the header is built directly: dataclasses.asdict deep-copies and cost ~45 us a record.
_HEADER_FIELDS: dict[type, tuple[str, ...]] = {
    t: tuple(f.name for f in fields(t) if f.name != "data") for t in _TYPES.values()}
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode(m: Record) -> tuple[bytes, bytes]:
    """(JSON header, payload) of one record."""
    cls = type(m)
    header = {name: getattr(m, name) for name in _HEADER_FIELDS[cls]}
    header["t"] = cls.__name__
    return _JSON.encode(header).encode(), m.data if cls is Add else b""  # type: ignore[union-attr]


def decode(header: bytes, payload: bytes) -> Record:
    fields: dict[str, Any] = json.loads(header)
    cls = _TYPES[fields.pop("t")]
    for key, value in fields.items():
        if isinstance(value, list):
            fields[key] = tuple(value)
    if cls is Add:
        fields["data"] = payload
    return cls(**fields)
