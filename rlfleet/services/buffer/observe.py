"""Prometheus metrics (rlfleet.runtime.metrics.BufferMetrics) updated from committed mutations."""

from __future__ import annotations

from rlfleet.runtime.metrics import BufferMetrics
from rlfleet.services.buffer.mutations import (
    AckSteps,
    Add,
    Cancel,
    Close,
    Deliver,
    Discard,
    Mutation,
    Quarantine,
    Refuse,
    Stale,
)
from rlfleet.services.buffer.state import State


def observe(m: BufferMetrics, state: State, muts: list[Mutation]) -> None:
    """Count what muts did (state: after they were applied) and refresh the gauges."""
    for mut in muts:
        if isinstance(mut, Add):
            m.put.inc()
        elif isinstance(mut, Close):
            for reason, n in mut.drops.items():
                m.dropped.labels(reason=reason).inc(n)
        elif isinstance(mut, Stale):
            m.dropped.labels(reason=mut.reason).inc(mut.samples)
        elif isinstance(mut, Cancel):
            m.dropped.labels(reason=mut.reason).inc(len(mut.sample_seqs))
        elif isinstance(mut, Refuse):
            m.dropped.labels(reason=mut.reason).inc(mut.samples)
        elif isinstance(mut, Discard):
            m.dropped.labels(reason="aborted").inc(len(mut.indices))
        elif isinstance(mut, Deliver):
            for gid in mut.gids:
                for e in state.delivered[gid].entries():
                    m.delivered.inc()
                    m.staleness.observe(max(0, state.policy_version - e.weight_version))
        elif isinstance(mut, Quarantine):
            m.dropped.labels(reason="quarantined").inc(mut.samples)
        elif isinstance(mut, AckSteps):
            m.acked.inc(mut.samples)
    m.depth.set(state.stored_samples())
    m.ready_groups.set(len(state.ready))
    m.tickets_in_flight.set(len(state.open))
    m.policy_version.set(state.policy_version)
