"""trainer.profile on a replica: the torch engine traces its steps under the weight versions the profiled trainer steps
train from, into RUN_DIR/profile/<replica>-vV.json (rlfleet/runtime/torch_profile.py VersionProfiler)."""

from __future__ import annotations

import torch

from rlfleet.config import Config
from rlfleet.runtime.torch_profile import VersionProfiler, profile_dir
from rlfleet.services.rollout.engines.base import EngineError, ProfilesDecode


def trace_name(replica_id: str) -> str:
    """rollout-0 for replica rollout-0; rollout-<id> for a replica named otherwise (as its metrics log)."""
    return replica_id if replica_id.startswith("rollout-") else f"rollout-{replica_id}"


def attach_decode_profile(engine: object, cfg: Config, replica_id: str) -> VersionProfiler | None:
    """Attach a VersionProfiler to engine when trainer.profile asks for the replicas' decode; None when it does not.
    An engine that cannot trace itself is refused (rlfleet check refuses that config before anything starts)."""
    p = cfg.trainer.profile
    if not p.steps or not p.rollout:
        return None
    if not isinstance(engine, ProfilesDecode):
        raise EngineError(f"trainer.profile.rollout: engine {type(engine).__name__} cannot trace its decode; set "
                          f"trainer.profile.rollout: false or use rollout.engine: torch")
    profiler = VersionProfiler(p, p.versions(cfg.trainer.publish_every), profile_dir(cfg.run_dir),
                               trace_name(replica_id), torch.device(cfg.rollout.device))
    engine.profile_decode(profiler)
    return profiler
