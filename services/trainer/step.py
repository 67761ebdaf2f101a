"""One optimizer step on this rank's share of a batch: old logprobs, advantages, loss, backward, clip, AdamW."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.protocols import AdvantageEstimator, LossFn, TrainBatch
from rlfleet.sample import Sample
from services.trainer.batch import batch_to, build_train_batch, forward_logprobs
from services.trainer.collectives import all_reduce_sum
from services.trainer.hooks import call_hooks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepContext:
    """What a step needs besides the model: plugins, hooks and knobs."""

    advantage_fn: AdvantageEstimator
    loss_fn: LossFn
    hooks: Sequence[Any]
    temperature: float
    minibatches: int
    grad_clip: float
    world_size: int
    device: torch.device
    pad_id: int = 0


def _select_rows(batch: TrainBatch, rows: torch.Tensor, advantages: torch.Tensor) -> tuple[TrainBatch, torch.Tensor]:
    # rows: [S'] indices into the batch; returns the sub-batch and its advantages [S', T]
    def pick(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[rows]

    sub = TrainBatch(
        input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
        response_mask=batch.response_mask[rows], response_start=batch.response_start[rows],
        rollout_logprobs=batch.rollout_logprobs[rows], rewards=batch.rewards[rows],
        group_index=batch.group_index[rows], weight_versions=batch.weight_versions[rows],
        sample_ids=[batch.sample_ids[i] for i in rows.tolist()], old_logprobs=pick(batch.old_logprobs),
        ref_logprobs=pick(batch.ref_logprobs), teacher_logprobs=pick(batch.teacher_logprobs),
        values=pick(batch.values), extras=batch.extras,
    )
    return sub, advantages[rows]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip_grad: Callable[[float], float],
               groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
    """Train on this rank's groups (collective: every rank calls it with the same number of groups).

    Returns metrics summed over ranks (loss metrics are global token means), averaged over minibatches.
    """
    if len(groups) % ctx.minibatches:
        raise ValueError(f"{len(groups)} groups per rank do not split into trainer.minibatches={ctx.minibatches}")
    samples = [s for g in groups for s in g]
    batch = build_train_batch(samples, ctx.pad_id)
    batch = batch_to(batch, ctx.device)
    call_hooks(ctx.hooks, "before_logprobs", batch)
    model.train()
    with torch.no_grad():
        batch.old_logprobs = forward_logprobs(model, batch, ctx.temperature)        # [S, T]
    advantages = ctx.advantage_fn(batch).to(torch.float32)                        # [S, T]
    bounds = _row_bounds([len(g) for g in groups], len(groups) // ctx.minibatches, ctx.minibatches)
    totals: dict[str, float] = {}
    for lo, hi in bounds:
        rows = torch.arange(lo, hi, device=ctx.device)
        mb, mb_adv = _select_rows(batch, rows, advantages)
        token_count = all_reduce_sum([float(mb.response_mask.sum())], ctx.device)[0]
        logprobs = forward_logprobs(model, mb, ctx.temperature)                  # [S', T]
        out = ctx.loss_fn(logprobs, mb_adv, mb, token_count)
        # FSDP averages gradients over ranks; the loss is already this rank's share of the global mean.
        (out.loss * ctx.world_size).backward()
        call_hooks(ctx.hooks, "before_step", step, mb)
        grad_norm = clip_grad(ctx.grad_clip)          # global norm: every rank takes the same branch
        if math.isfinite(grad_norm):
            optimizer.step()
        else:
            log.warning("step %d: gradient norm is %s; optimizer step skipped", step, grad_norm)
            totals["skipped_updates"] = totals.get("skipped_updates", 0.0) + 1.0
            grad_norm = 0.0
        optimizer.zero_grad(set_to_none=True)
        names = sorted(out.metrics)
        summed = all_reduce_sum([float(out.loss.detach())] + [float(out.metrics[k]) for k in names], ctx.device)
        for key, value in zip(["loss", *names], summed, strict=True):
            totals[key] = totals.get(key, 0.0) + value / len(bounds)     # mean over minibatches
        totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm / len(bounds)
    counts = all_reduce_sum([float(len(samples)), float(batch.response_mask.sum()), float(batch.rewards.sum())],
                            ctx.device)
    totals.update(samples=counts[0], tokens=counts[1], reward_mean=counts[2] / max(counts[0], 1.0))
    return totals


def _row_bounds(group_sizes: Sequence[int], groups_per_mb: int, count: int) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of each minibatch, which holds groups_per_mb whole groups."""
    bounds, lo = [], 0
    for i in range(count):
        hi = lo + sum(group_sizes[i * groups_per_mb:(i + 1) * groups_per_mb])
        bounds.append((lo, hi))
        lo = hi
    return bounds

