"""Where the services are: their addresses (the launcher or the chart fills them) and, on one machine, the cores each
local service is pinned to."""

from __future__ import annotations

from pydantic import Field

from rlfleet.config.section import Section


class EndpointsConfig(Section):
    """host:port of each service. The launcher fills these with free loopback ports."""

    buffer: str = Field("", description="The buffer.")
    weight_sync: str = Field("", description="The weight sync service.")
    trainer: str = Field("", description="The trainer (rank 0).")
    rollout: list[str] = Field([], description="The rollout replicas.")
    trainer_data: str = Field("", description="The trainer's weight data plane (bucketed over gRPC).")
    rendezvous: str = Field("", description="torch.distributed master addr:port for trainer ranks.")


# issue 15: speed. Cores per local service (rlfleet/local/placement.py) and the fast paths' off-switches.
class ServicePlacement(Section):
    """One local service's (each trainer rank's, each rollout replica's) share of the cores; null: derived."""

    cores: int | None = Field(None, ge=1, description="CPUs it is pinned to (sched_setaffinity).")
    threads: int | None = Field(None, ge=1, description="Torch intra-op threads (default: its cores).")


class PlacementConfig(Section):
    """Cores per local service (rlfleet/local/placement.py)."""

    pin: bool = Field(True, description="Pin each service to its cores (false: threads only).")
    trainer: ServicePlacement = Field(ServicePlacement(), description="Each trainer rank.")
    rollout: ServicePlacement = Field(ServicePlacement(), description="Each rollout replica.")
    buffer: ServicePlacement = Field(ServicePlacement(), description="The buffer.")
    weight_sync: ServicePlacement = Field(ServicePlacement(), description="The weight sync service.")
