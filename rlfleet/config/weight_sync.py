"""The weight_sync section: transports and verification."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.config.section import Section


class WeightSyncConfig(Section):
    """How published weights reach the rollout replicas."""

    transport: Literal["bucketed", "broadcast", "nixl", "disk_delta", "auto"] = Field(
        "bucketed", description="bucketed: gRPC stream; broadcast: gloo/NCCL group (gRPC stream for replicas "
        "outside it); nixl: P2P WRITEs; disk_delta: changed elements in files under delta_dir; auto: probe at "
        "start-up, pick by model size.")
    bucket_mb: float = Field(512.0, gt=0, description="Size of a weight bucket in MB.")
    chunk_kb: int = Field(1024, ge=16, description="gRPC streaming chunk size in KB.")
    update_timeout: float = Field(120.0, gt=0, description="Seconds a weight update may take (sending, loading, "
                                  "verifying).")
    pause_mode: Literal["in_place", "retract"] = Field("in_place", description="While loading: keep in-flight "
                                                       "requests, or abort them.")
    join_seconds: float = Field(60.0, gt=0, description="broadcast: how long the trainer waits for replicas to "
                                "join the group.")
    group_host: str = Field("", description="broadcast: rendezvous host (\"\": the host of "
                            "endpoints.trainer_data).")
    broadcast_op_timeout: float = Field(30.0, gt=0, description="broadcast: seconds one broadcast op may take on "
                                        "the trainer before the group is dropped. A frozen member stalls a publish "
                                        "this long at most; the version then goes over the gRPC stream and the "
                                        "group re-forms without it.")
    delta_dir: str = Field("", description="disk_delta: shared folder (\"\": RUN_DIR/weights_delta).")
    delta_encoding: Literal["xor", "overwrite"] = Field("xor", description="disk_delta: changed elements as XOR "
                                                        "with the base, or their new values.")
    rebase_every: int = Field(50, ge=1, description="disk_delta: a full base every this many versions.")
    data_plane_tls: bool = Field(True, description=(
        "security.mode mtls: serve the gRPC weight data plane (bucketed, broadcast's fallback) over mTLS too. False: "
        "plaintext, each Fetch carrying a random token the manifest brings over the mTLS control plane. Needs signed "
        "weights (replicas refuse such a version without the run's public key: integrity stays); loses the weights' "
        "confidentiality on the wire and lets anyone who sees the traffic fetch staged versions."))
