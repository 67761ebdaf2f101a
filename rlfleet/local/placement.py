"""Which cores each local service gets: `rlfleet run` pins every process to its share of the launcher's CPUs
(`os.sched_getaffinity`) and gives it as many torch threads as cores, so trainer and rollout do not fight over them.

Defaults (`plan`), from the n CPUs the launcher may use:
- buffer and weight_sync are light (gRPC and I/O): one thread each; with n >= 8 they share the last CPU, which the
  heavy services leave them; below that they float over all CPUs.
- trainer ranks and rollout replicas ("heavy") share the rest, the pool of m CPUs: the trainer side gets the first
  ceil(m/2), the rollout side the others, each side's CPUs dealt to its ranks / replicas in equal contiguous blocks
  (at least one each; with fewer CPUs than processes, blocks wrap around and processes share). Threads = the block's
  size, so the threads of heavy processes that compute at once never exceed the CPUs: measured here, two 2-thread
  processes on 2 shared cores ran a step 3.5x slower than two 1-thread ones (OpenMP threads spin against each other).
  - when they overlap in time (`buffer.max_staleness >= 1`: rollout generates step s+1 while the trainer trains
    step s) each process is pinned to its block;
  - when they take turns (`max_staleness: 0`, the synchronous loop) the trainer side and the rollout side never
    compute at once, so each side gets the whole pool: every process may run anywhere in it (affinity = the pool)
    with the pool's CPUs divided among that side's processes as threads (1 rank: all of them). Measured on the
    word-problem recipe (2 CPUs): generation waits fell from 14.5 s to 9.7 s a step with the replica at 2 threads
    instead of 1, and the trainer's step time did not change.
- So: 1 CPU -> everything on it, 1 thread each. 2 CPUs async -> trainer on CPU 0, rollout on CPU 1 (sync: 2 threads
  each on both CPUs). 64 CPUs async, 1 rank, 1 replica -> trainer 0-31, rollout 32-62, buffer + weight_sync on 63
  (sync: 63 threads each on 0-62).
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


def _placed(pool: Sequence[int], start: int, default_cores: int, override: ServicePlacement,
            pinned: bool, turn_threads: int) -> Placement:
    """Its block of the pool; taking turns (not pinned to the block) it may run anywhere in the pool, with
    turn_threads threads (its side's share of the whole pool)."""
    block = _take(pool, start, override.cores or default_cores)
    if pinned or override.cores:
        return Placement(cpus=block, threads=override.threads or len(block))
    return Placement(cpus=tuple(pool), threads=override.threads or turn_threads)


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
    # threads never oversubscribe: the pool is dealt out, trainer side first (ceil(m/2)), rollout the rest
    trainer_total = (m + 1) // 2 if m > 1 else 1
    rollout_start, rollout_total = (trainer_total % m, max(1, m - trainer_total))
    out: dict[str, Placement] = {}
    for name in ("buffer", "weight_sync"):
        o: ServicePlacement = getattr(cfg, name)
        cpus_light = _take(light_pool, 0, o.cores or len(light_pool))
        out[name] = Placement(cpus=cpus_light, threads=o.threads or 1)
    per_rank = cfg.trainer.cores or max(1, trainer_total // trainer_ranks)
    per_replica = cfg.rollout.cores or max(1, rollout_total // replicas)
    trainer = cfg.trainer if trainer_threads is None else cfg.trainer.model_copy(update={"threads": trainer_threads})
    for r in range(trainer_ranks):
        out[f"trainer-{r}"] = _placed(pool, r * per_rank, per_rank, trainer, overlap, max(1, m // trainer_ranks))
    for i in range(replicas):
        out[f"rollout-{i}"] = _placed(pool, rollout_start + i * per_replica, per_replica, cfg.rollout, overlap,
                                      max(1, m // replicas))
    return out


def thread_env(p: Placement) -> dict[str, str]:
    """The environment that sets a child's torch / OpenMP / MKL thread counts."""
    return {"OMP_NUM_THREADS": str(p.threads), "MKL_NUM_THREADS": str(p.threads)}
