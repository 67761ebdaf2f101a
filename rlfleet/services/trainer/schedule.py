"""Learning-rate schedule over trainer steps (one scheduler step per trainer step, whatever trainer.minibatches):
linear warmup from lr / warmup_steps to lr, then constant, or cosine down to min_ratio * lr at the last step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from rlfleet.config import SchedulerConfig


def lr_factor(step: int, cfg: SchedulerConfig, total_steps: int) -> float:
    """Multiplier of trainer.lr for the optimizer steps of trainer step `step` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    span = max(total_steps - cfg.warmup_steps - 1, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    return cfg.min_ratio + (1.0 - cfg.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, total_steps: int) -> LambdaLR:
    """A LambdaLR whose state (last_epoch = trainer steps done) goes into checkpoints as JSON."""
    def factor(step: int) -> float:
        return lr_factor(step, cfg, total_steps)

    return LambdaLR(optimizer, factor)


def restore_scheduler(scheduler: LambdaLR, state: dict) -> None:
    """Load a scheduler state and set every param group's lr to what the restored step trains with."""
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    step = scheduler.last_epoch
    for group, base, fn in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas,
                               strict=True):
        group["lr"] = base * fn(step)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]


def scheduler_state(scheduler: LambdaLR) -> dict:
    """JSON-able state (no pickled callables)."""
    state = scheduler.state_dict()
    state.pop("lr_lambdas", None)
    return {k: v for k, v in state.items() if isinstance(v, (int, float, bool, list, str)) or v is None}
