"""Who may call what: the one table of roles per RPC, and the requests bound to the caller's own name.

Every RPC of every rlfleet service is listed (a method missing from the table is refused for every role), and the
authorization interceptor (rlfleet.security.authz) checks each call against it. `LONG_POLLS` are the methods that
may hold a server thread while they wait; they get a share of the threads, never all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ALL = frozenset({"trainer", "rollout", "buffer", "weight_sync", "controller", "operator"})
OBSERVERS = frozenset({"controller", "operator"})

# "/package.Service/Method" -> the roles allowed to call it
ALLOWED: dict[str, frozenset[str]] = {
    # Buffer: replicas claim and deliver; the trainer takes batches, commits steps and quarantines what it cannot use
    "/rlfleet.v1.Buffer/Claim": frozenset({"rollout"}),
    "/rlfleet.v1.Buffer/Put": frozenset({"rollout"}),
    "/rlfleet.v1.Buffer/GetBatch": frozenset({"trainer"}),
    "/rlfleet.v1.Buffer/Ack": frozenset({"trainer"}),
    "/rlfleet.v1.Buffer/Reject": frozenset({"trainer"}),
    "/rlfleet.v1.Buffer/Stats": frozenset({"trainer"}) | OBSERVERS,
    "/rlfleet.v1.Buffer/TrainerResume": frozenset({"trainer"}),
    # Rollout: the trainer evaluates (Generate) and may load weights directly; operators pause and look
    "/rlfleet.v1.Rollout/Generate": frozenset({"trainer", "operator"}),
    "/rlfleet.v1.Rollout/Pause": frozenset({"trainer"}) | OBSERVERS,
    "/rlfleet.v1.Rollout/Resume": frozenset({"trainer"}) | OBSERVERS,
    "/rlfleet.v1.Rollout/LoadWeights": frozenset({"trainer"}),
    "/rlfleet.v1.Rollout/Status": frozenset({"trainer"}) | OBSERVERS,
    # Trainer: observed and checkpointed by the controller and operators
    "/rlfleet.v1.Trainer/Status": OBSERVERS,
    "/rlfleet.v1.Trainer/Checkpoint": OBSERVERS,
    # WeightSync control plane: only the trainer publishes; replicas subscribe and acknowledge
    "/rlfleet.v1.WeightSync/Publish": frozenset({"trainer"}),
    "/rlfleet.v1.WeightSync/Subscribe": frozenset({"rollout"}),
    "/rlfleet.v1.WeightSync/Ack": frozenset({"rollout"}),
    "/rlfleet.v1.WeightSync/Verify": frozenset({"trainer", "rollout"}) | OBSERVERS,
    "/rlfleet.v1.WeightSync/Register": frozenset({"trainer", "rollout"}),
    "/rlfleet.v1.WeightSync/Peers": frozenset({"trainer", "rollout"}),
    # WeightStream data plane (served by the trainer): replicas fetch buckets
    "/rlfleet.v1.WeightStream/Fetch": frozenset({"rollout"}),
    # health: any identity of the run (probes of a peer, the launcher's wait)
    "/grpc.health.v1.Health/Check": ALL,
    "/grpc.health.v1.Health/Watch": ALL,
}

LONG_POLLS = frozenset({"/rlfleet.v1.Buffer/Claim", "/rlfleet.v1.Buffer/Put", "/rlfleet.v1.WeightSync/Subscribe",
                        "/rlfleet.v1.WeightSync/Peers", "/rlfleet.v1.WeightSync/Verify",
                        "/grpc.health.v1.Health/Watch"})


def _own_replica(field: str) -> Callable[[Any, str, str], str | None]:
    def check(request: Any, role: str, name: str) -> str | None:
        got = getattr(request, field)
        if role == "rollout" and got != name:
            return f"{field} '{got}' is not the caller's own identity '{name}'"
        return None
    return check


def _own_peer(request: Any, role: str, name: str) -> str | None:
    """A replica registers only itself; a trainer rank only as 'trainer' or its own trainer-<rank>."""
    pid = request.peer_id
    if role == "rollout" and pid != name:
        return f"peer_id '{pid}' is not the caller's own identity '{name}'"
    if role == "trainer" and pid not in ("trainer", name):
        return f"peer_id '{pid}' is not 'trainer' or the caller's own identity '{name}'"
    return None


def _own_samples(request: Any, role: str, name: str) -> str | None:
    """A replica puts only samples that name it: an empty replica_id is refused too (the buffer then skipped the
    check that the group's ticket is the caller's, and the victim's own samples counted as duplicates)."""
    if role != "rollout":
        return None
    for s in request.samples:
        if s.replica_id != name:
            return f"samples[].replica_id '{s.replica_id}' is not the caller's own identity '{name}'"
    return None


# requests that name the caller: the name must be the certificate's
BOUND: dict[str, Callable[[Any, str, str], str | None]] = {
    "/rlfleet.v1.Buffer/Claim": _own_replica("replica_id"),
    "/rlfleet.v1.Buffer/Put": _own_samples,
    "/rlfleet.v1.WeightSync/Subscribe": _own_replica("replica_id"),
    "/rlfleet.v1.WeightSync/Ack": _own_replica("replica_id"),
    "/rlfleet.v1.WeightStream/Fetch": _own_replica("replica_id"),
    "/rlfleet.v1.WeightSync/Register": _own_peer,
}


def allowed(method: str, role: str) -> bool:
    return role in ALLOWED.get(method, frozenset())
