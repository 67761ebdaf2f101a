"""Whether rollout replicas added to a run can get work, and what would let them: a scale that does nothing says so.

The buffer lets out at most `window` groups at once: ceil(buffer.over_sample x trainer.groups_per_step) per step,
for the steps the staleness bound allows ahead (buffer.max_staleness + 1), times trainer.publish_every
(rlfleet/services/buffer/settings.py `fair_share`, gate.py). One replica holds up to rollout.claim_groups of them
(or its fair share when the run started with several). Replicas beyond window / that hold find nothing to claim:
e.g. a synchronous run (max_staleness 0) with 2 groups a step and claim_groups 4 keeps a second replica idle for its
whole life.
"""

from __future__ import annotations

import math

from rlfleet.config import Config


def groups_out_at_once(cfg: Config) -> int:
    per_step = math.ceil(cfg.buffer.over_sample * cfg.trainer.groups_per_step)
    return per_step * (cfg.buffer.max_staleness + 1) * cfg.trainer.publish_every


def held_per_replica(cfg: Config) -> int:
    """Groups one replica may hold at once: rollout.claim_groups, or its fair share when the run started with more
    than one replica (the buffer's BufferSettings.fair_share)."""
    started = cfg.rollout.replicas
    if started <= 1:
        return cfg.rollout.claim_groups
    return max(cfg.rollout.claim_groups, math.ceil(groups_out_at_once(cfg) / started))


def idle_replicas_hint(cfg: Config, replicas: int) -> str | None:
    """A sentence when some of `replicas` replicas cannot get work under `cfg`; None when all can."""
    window, hold = groups_out_at_once(cfg), held_per_replica(cfg)
    busy = max(1, math.ceil(window / hold))
    if replicas <= busy:
        return None
    idle = replicas - busy
    b, t = cfg.buffer, cfg.trainer
    staleness = math.ceil(hold * replicas / (math.ceil(b.over_sample * t.groups_per_step) * t.publish_every)) - 1
    fixes = []
    if cfg.rollout.replicas <= 1 and window >= replicas:
        fixes.append(f"rollout.claim_groups: {math.ceil(window / replicas)} (each replica holds fewer)")
    if staleness <= 3:
        fixes.append(f"buffer.max_staleness: {staleness} (rollout of later steps overlaps training)")
    fixes.append("more trainer.groups_per_step or buffer.over_sample")
    return (f"{idle} of {replicas} rollout replicas will get no work: the buffer lets out at most {window} groups "
            f"at once (ceil(buffer.over_sample {b.over_sample:g} x trainer.groups_per_step {t.groups_per_step}) x "
            f"(buffer.max_staleness {b.max_staleness} + 1)"
            + (f" x trainer.publish_every {t.publish_every}" if t.publish_every != 1 else "")
            + f") and one replica holds up to {hold}; what would let them work: " + ", or ".join(fixes))
