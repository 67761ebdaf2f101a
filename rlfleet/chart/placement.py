"""Where the run's GPU pods land, as the chart's scheduling rules put them (deploy/helm/rlfleet/templates):

- trainer pods, a gang, all in one rack of topology.racks (required pod affinity on the rack label);
- spares in the trainer's rack, one per node, never on a node running a rank (so each holds a node of its own);
- rollout replicas (a LeaderWorkerSet replica: `size` pods, kept in its leader's rack here) spread over
  topology.rolloutRacks with at most topology.rolloutMaxSkew between racks (DoNotSchedule), at their most: the
  autoscaler's maxReplicas when one is on.
Empty rack lists mean every rack `sizing.racks` names. Trainer pods go first, then spares, then rollout pods, each
onto the first node with room (first fit: it can refuse a layout an exact packing would fit only when the pods' GPU
counts differ and do not divide one another). A layout fits when some choice of the trainer's rack and some spread of
the replicas within the skew fits every rack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Demand:
    """The GPU pods a stack of values asks for."""

    trainer_pods: int
    trainer_gpus: int            # per pod
    spares: int
    replicas: int                # rollout replicas at their most
    pods_per_replica: int
    replica_pod_gpus: int        # per pod
    trainer_racks: list[str]
    rollout_racks: list[str]
    max_skew: int

    @property
    def run_gpus(self) -> int:
        """GPUs the run itself holds (spares are placeholders on extra nodes, not counted)."""
        return self.trainer_pods * self.trainer_gpus + self.replicas * self.pods_per_replica * self.replica_pod_gpus


def demand(values: dict[str, Any], racks: list[str]) -> Demand:
    t, r, topo = values["trainer"], values["rollout"], values["topology"]
    replicas = int(r["replicas"])
    for scaler in ("hpa", "keda"):
        if r[scaler]["enabled"]:
            replicas = max(replicas, int(r[scaler]["maxReplicas"]))
    lws = r["leaderWorkerSet"]
    return Demand(int(t["pods"]), int(t["gpusPerPod"]), int(values["spares"]["count"]), replicas,
                  int(lws["size"]) if lws["enabled"] else 1, int(r["gpusPerReplica"]),
                  list(topo.get("racks") or racks), list(topo.get("rolloutRacks") or racks),
                  int(topo["rolloutMaxSkew"]))


@dataclass
class RackLoad:
    """One rack: its nodes' free GPUs, and the GPUs of each pod put there, by what it is."""

    node_gpus: int
    nodes: list[int]
    placed: dict[str, list[int]] = field(default_factory=dict)

    def put(self, what: str, gpus: int, fresh_node: bool = False) -> bool:
        """Onto the first node with room (fresh_node: only a node nothing else is on)."""
        for i, free in enumerate(self.nodes):
            if free >= gpus and (not fresh_node or free == self.node_gpus):
                self.nodes[i] -= gpus
                self.placed.setdefault(what, []).append(gpus)
                return True
        return False


def place(d: Demand, nodes: dict[str, int], gpus_per_node: int) -> tuple[dict[str, RackLoad] | None, str]:
    """A layout that fits (rack -> its load) and a line saying where everything went; or None and why not."""
    for rack in [*d.trainer_racks, *d.rollout_racks]:
        if rack not in nodes:
            return None, f"rack {rack} (named in topology) is not in sizing.racks"
    whys = []
    for trainer_rack in d.trainer_racks:
        load = {rack: RackLoad(gpus_per_node, [gpus_per_node] * n) for rack, n in nodes.items()}
        if why := _trainer_and_spares(d, load[trainer_rack], trainer_rack):
            whys.append(why)
            continue
        room = [_replica_room(d, load[rack]) for rack in d.rollout_racks]
        spread = _spread(d.replicas, room, d.max_skew)
        if spread is None:
            whys.append(f"trainer in {trainer_rack}: {d.replicas} replicas of {d.pods_per_replica} pods x "
                        f"{d.replica_pod_gpus} GPUs cannot spread over {', '.join(d.rollout_racks)} within "
                        f"topology.rolloutMaxSkew {d.max_skew}: room for {', '.join(map(str, room))} beside the rest")
            continue
        for rack, n in zip(d.rollout_racks, spread, strict=True):
            for _ in range(n * d.pods_per_replica):
                load[rack].put("rollout", d.replica_pod_gpus)
        return load, describe(load, gpus_per_node)
    return None, "; ".join(whys)


def _trainer_and_spares(d: Demand, home: RackLoad, rack: str) -> str:
    """'' when the trainer's pods and the spares fit in its rack; else what did not."""
    for _ in range(d.trainer_pods):
        if not home.put("trainer", d.trainer_gpus):
            return f"the trainer's {d.trainer_pods} pods x {d.trainer_gpus} GPUs do not fit in {rack}"
    for _ in range(d.spares):
        if not home.put("spares", d.trainer_gpus, fresh_node=True):
            return f"{d.spares} spares (a node each, beside the trainer's {d.trainer_pods} pods) do not fit in {rack}"
    return ""


def _replica_room(d: Demand, rack: RackLoad) -> int:
    """How many more replicas fit in the rack (first fit on a copy of its nodes), at most all of them."""
    trial = RackLoad(rack.node_gpus, list(rack.nodes))
    for n in range(d.replicas):
        if not all(trial.put("rollout", d.replica_pod_gpus) for _ in range(d.pods_per_replica)):
            return n
    return d.replicas


def _spread(n: int, room: list[int], skew: int) -> list[int] | None:
    """Replicas per rack, each within its room, summing to n, max - min <= skew; None when there is none. For each
    floor m every rack takes m to min(room, m + skew): a spread exists for m when the bounds bracket n."""
    for m in range(min(room) + 1):
        high = [min(r, m + skew) for r in room]
        if len(room) * m <= n <= sum(high):
            out, left = [m] * len(room), n - len(room) * m
            for i, h in enumerate(high):
                add = min(h - m, left)
                out[i] += add
                left -= add
            return out
    return None


def describe(load: dict[str, RackLoad], gpus_per_node: int) -> str:
    parts = []
    for rack, r in load.items():
        used = ", ".join(f"{what} {len(p)} pods = {sum(p)}" for what, p in r.placed.items()) or "nothing"
        parts.append(f"{rack} ({len(r.nodes)} nodes x {gpus_per_node} GPUs): {used}; "
                     f"{sum(sum(p) for p in r.placed.values())} of {len(r.nodes) * gpus_per_node} GPUs")
    return "; ".join(parts)
