"""Which tickets a Claim gets: expired leases re-issued first (same group id), then new groups from the durable cursor,
while the store has room for their samples, a step is left for them, and the replica's weights are new enough for
the step they would serve (rlfleet/services/buffer/gate.py). A pure function of the State, as put_sorting.py's are;
BufferCore.claim commits the Issue mutations it returns (rlfleet/services/buffer/core.py).
"""

from __future__ import annotations

from rlfleet.services.buffer.gate import Gate
from rlfleet.services.buffer.mutations import Issue
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.state import State

STALENESS = "staleness"   # Claim reason prefix: the replica must load newer weights first


def group_id(prompt_index: int) -> str:
    return f"g{prompt_index}"


def issue_mutations(state: State, settings: BufferSettings, gate: Gate, replica: str, version: int, max_groups: int,
                    now: float) -> tuple[list[Issue], str]:
    """Up to max_groups Issue mutations for `replica` (at weight `version`), and why there are not more ("" when
    max_groups were issued)."""
    s, st = settings, state
    expired = sorted((g for g in st.open.values() if g.deadline <= now), key=lambda g: g.prompt_index)
    in_flight = len(st.open) - len(expired)
    stored, cursor = st.stored_samples(), st.next_prompt_index
    delivered = st.acked_groups + len(st.delivered)
    pending = len(st.ready) + len(st.open)      # live groups not yet delivered (dropped ones excluded)
    muts: list[Issue] = []
    reason = ""
    while len(muts) < max_groups:
        requeued = expired.pop(0) if expired else None
        size = requeued.group_size if requeued else s.group_size
        if stored + size * in_flight + size > s.capacity:
            reason = f"capacity: {stored} stored + {in_flight} groups in flight of {s.capacity}"
            break
        step = gate.step_of(delivered, pending - 1 if requeued else pending)
        if requeued is None and step >= s.steps:
            reason = "every step's groups are claimed"
            break
        need = gate.version_needed(step)
        if version < need:
            reason = f"{STALENESS}: step {step} needs weight version >= {need}, replica has {version}"
            if requeued is not None:
                expired.insert(0, requeued)
            break
        if requeued is not None:
            muts.append(Issue(requeued.gid, requeued.prompt_index, size, now + s.lease_seconds, replica, version))
        else:
            muts.append(Issue(group_id(cursor), cursor, size, now + s.lease_seconds, replica, version))
            cursor += 1
            pending += 1
        in_flight += 1
    return muts, reason
