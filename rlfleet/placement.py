"""Which cores each local service gets: `rlfleet run` pins every process to its share of the launcher's CPUs
(`os.sched_getaffinity`) and gives it as many torch threads as cores, so trainer and rollout do not fight over them.

Defaults (`plan`), from the n CPUs the launcher may use:
- buffer and weight_sync are light (gRPC and I/O): one thread each; with n >= 8 they share the last CPU, which the
  heavy services leave them; below that they float over all CPUs.
- trainer ranks and rollout replicas ("heavy") share the rest, the pool of m CPUs:
  - when they overlap in time (`buffer.max_staleness >= 1`: rollout generates step s+1 while the trainer trains
    step s) the pool is split: the trainer ranks get the first ceil(m/2) CPUs, the rollout replicas the others;
  - when they take turns (`max_staleness: 0`, the synchronous loop) each side spans the whole pool, since only one
    of them computes at a time;
  - each side's CPUs are dealt to its ranks / replicas in equal contiguous blocks (at least one CPU each; with
    fewer CPUs than processes, blocks wrap around and processes share).
- So: 1 CPU -> everything on it, 1 thread each. 2 CPUs async -> trainer on CPU 0, rollout on CPU 1 (sync: both on
  both, 2 threads). 64 CPUs async, 1 rank, 1 replica -> trainer 0-31, rollout 32-62, buffer + weight_sync on 63.
`placement.<service>.cores` / `.threads` override the per-process counts; `placement.pin: false` keeps the threads
and leaves affinity alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet.config import PlacementConfig, ServicePlacement

LIGHT_RESERVE_FROM = 8      # with at least this many CPUs, buffer + weight_sync get one of their own


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...]       # CPUs the process may run on
    threads: int                # torch intra-op threads (OMP_NUM_THREADS)


def _take(pool: Sequence[int], start: int, count: int) -> tuple[int, ...]:
    count = min(count, len(pool))
    return tuple(sorted(pool[(start + j) % len(pool)] for j in range(count)))


def _placed(pool: Sequence[int], start: int, default_cores: int, override: ServicePlacement) -> Placement:
    cpus = _take(pool, start, override.cores or default_cores)
    return Placement(cpus=cpus, threads=override.threads or len(cpus))


def plan(cpus: Sequence[int], trainer_ranks: int, replicas: int, overlap: bool,
         cfg: PlacementConfig | None = None, trainer_threads: int | None = None) -> dict[str, Placement]:
    """Placement of every local process by name: buffer, weight_sync, trainer-R, rollout-I."""
    if not cpus:
        raise ValueError("no CPUs to place services on")
    cfg = cfg or PlacementConfig()
    cpus = sorted(set(cpus))
    n = len(cpus)
    light_pool, pool = (cpus[-1:], cpus[:-1]) if n >= LIGHT_RESERVE_FROM else (cpus, cpus)
    m = len(pool)
    if overlap and m > 1:
        trainer_total, rollout_start = (m + 1) // 2, (m + 1) // 2
        rollout_total = m - trainer_total
    else:
        trainer_total, rollout_start, rollout_total = m, 0, m
    out: dict[str, Placement] = {}
    for name in ("buffer", "weight_sync"):
        o: ServicePlacement = getattr(cfg, name)
        cpus_light = _take(light_pool, 0, o.cores or len(light_pool))
        out[name] = Placement(cpus=cpus_light, threads=o.threads or 1)
    per_rank = cfg.trainer.cores or max(1, trainer_total // trainer_ranks)
    trainer = cfg.trainer if trainer_threads is None else cfg.trainer.model_copy(update={"threads": trainer_threads})
    for r in range(trainer_ranks):
        out[f"trainer-{r}"] = _placed(pool, r * per_rank, per_rank, trainer)
    per_replica = cfg.rollout.cores or max(1, rollout_total // replicas)
    for i in range(replicas):
        out[f"rollout-{i}"] = _placed(pool, rollout_start + i * per_replica, per_replica, cfg.rollout)
    return out


def thread_env(p: Placement) -> dict[str, str]:
    """The environment that sets a child's torch / OpenMP / MKL thread counts."""
    return {"OMP_NUM_THREADS": str(p.threads), "MKL_NUM_THREADS": str(p.threads)}
