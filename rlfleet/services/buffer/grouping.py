"""What happens to a complete group: FAILED/ABORTED samples drop, too few valid ones drop it, filters may drop it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlfleet.sample import Sample, Status
from rlfleet.services.buffer.filters import GroupFilter
from rlfleet.services.buffer.mutations import Close
from rlfleet.services.buffer.state import Entry, Group
from rlfleet.v1 import sample_pb2

log = logging.getLogger(__name__)
_DROPPED_STATUS = {int(Status.FAILED): "failed", int(Status.ABORTED): "aborted"}


def close_group(g: Group, entries: dict[int, Entry], seq: int, min_valid: int,
                filters: Sequence[GroupFilter]) -> Close:
    """The Close mutation for group g with all its entries: which samples stay, which drop and why."""
    drops: dict[str, int] = {}
    kept = []
    for i in sorted(entries):
        reason = _DROPPED_STATUS.get(entries[i].status)
        if reason:
            drops[reason] = drops.get(reason, 0) + 1
        else:
            kept.append(i)
    if len(kept) < min(min_valid, g.group_size):        # a group of 1 needs 1 valid sample, whatever the setting
        log.info("group %s dropped: %d valid samples of %d", g.gid, len(kept), g.group_size)
        why: str | None = "failed"
    else:
        why = run_filters(g.gid, [entries[i] for i in kept], filters)
    if why:
        drops[why] = drops.get(why, 0) + len(kept)
        kept = []
    drop_seqs = tuple(e.seq for i, e in sorted(entries.items()) if i not in kept)
    return Close(g.gid, tuple(kept), seq, drops, drop_seqs)


def run_filters(gid: str, entries: list[Entry], filters: Sequence[GroupFilter]) -> str | None:
    """'filtered' when a filter drops the group, else None. A filter that raises is logged and skipped."""
    for f in filters:
        group = ([Sample.from_proto(sample_pb2.Sample.FromString(e.data)) for e in entries]
                 if f.needs_samples else entries)
        try:
            why = f.fn(group)
        except Exception:  # noqa: BLE001 - a broken filter must not lose the group
            log.exception("filter %s raised on group %s; group kept", f.name, gid)
            continue
        if why:
            log.info("group %s dropped by filter %s: %s", gid, f.name, why)
            return "filtered"
    return None
