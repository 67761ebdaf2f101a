"""One optimizer step on this rank's share of a batch: old logprobs (and reference / teacher logprobs, critic
values), advantages, loss, backward, clip, AdamW (and the critic's update for PPO)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from rlfleet.protocols import AdvantageEstimator, LossFn, NeedsOldLogprobs, TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.advantages import ALL_REDUCE_SUM, RETURNS
from rlfleet.services.trainer.batch import batch_to, build_train_batch, forward_logprobs, select_rows
from rlfleet.services.trainer.collectives import all_reduce_max_floats, all_reduce_sum
from rlfleet.services.trainer.entropy import ENTROPY_GRAD
from rlfleet.services.trainer.hooks import call_hooks
from rlfleet.services.trainer.losses import METRIC_TOKENS, ROW_COUNT, SEQ_COUNT
from rlfleet.services.trainer.metric_reduce import finite_extremes, reduce_over_ranks
from rlfleet.services.trainer.routing_replay import RoutingReplay
from rlfleet.services.trainer.step_totals import add_batch_counts, add_minibatch, optimizer_step

log = logging.getLogger(__name__)

# (model, batch, temperature) -> response logprobs [S, T]; the backend's (packed or padded) forward
ForwardFn = Callable[[torch.nn.Module, TrainBatch, float], torch.Tensor]


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
    routing_replay: RoutingReplay | None = None     # trainer.routing_replay: set by the backend on its model
    forward: ForwardFn | None = None  # None: padded rows (rlfleet.services.trainer.batch.forward_logprobs)
    reference: Any | None = None                    # FrozenScorer: batch.ref_logprobs (KL penalty)
    teacher: Any | None = None                      # FrozenScorer: batch.teacher_logprobs (distillation)
    critic: Any | None = None                       # Critic: batch.values, trained per minibatch (PPO)
    entropy_grad: bool = False                      # the loss's entropy bonus needs the forward's entropy graph
    # one optimizer step per batch (minibatches 1): old logprobs = the training forward's, detached (one pass)
    single_pass: bool = True
    # single pass: rows with a zero advantage at every token skip the forward (algorithms.skips_zero_advantage)
    skip_zero_advantage: bool = False


def _select_rows(batch: TrainBatch, rows: torch.Tensor, advantages: torch.Tensor) -> tuple[TrainBatch, torch.Tensor]:
    # rows: [S'] indices into the batch; returns the sub-batch and its advantages [S', T]
    return select_rows(batch, rows), advantages[rows]


def _logprobs(model: torch.nn.Module, batch: TrainBatch, ctx: StepContext) -> torch.Tensor:
    if ctx.forward is not None and ctx.routing_replay is None:     # packing keeps no per-row routes layout
        return ctx.forward(model, batch, ctx.temperature)
    return forward_logprobs(model, batch, ctx.temperature, ctx.routing_replay)


def uses_single_pass(ctx: StepContext) -> bool:
    """True when the batch feeds exactly one optimizer step, so the policy that computed old logprobs is the one
    being trained: old == current, and the no-grad forward would only repeat the training forward. A hook that
    must see old logprobs before the training forward says so with `needs_old_logprobs = True`
    (rlfleet.protocols.NeedsOldLogprobs)."""
    return ctx.single_pass and ctx.minibatches == 1 and \
        not any(isinstance(h, NeedsOldLogprobs) and h.needs_old_logprobs for h in ctx.hooks)


def prepare_batch(model: torch.nn.Module, batch: TrainBatch, ctx: StepContext,
                  old_logprobs: bool = True) -> torch.Tensor | None:
    """Fill old / reference / teacher logprobs and critic values; return advantages [S, T]. Collective.

    old_logprobs False (single pass): leave batch.old_logprobs unset and return None; the caller fills them from
    the training forward and then computes the advantages (some estimators, e.g. distill, read them)."""
    call_hooks(ctx.hooks, "before_logprobs", batch)
    model.train()
    if old_logprobs:
        with torch.no_grad():
            batch.old_logprobs = _logprobs(model, batch, ctx)                              # [S, T]
    if ctx.reference is not None:
        batch.ref_logprobs = ctx.reference(batch, ctx.temperature)                         # [S, T]
    if ctx.teacher is not None:
        batch.teacher_logprobs = ctx.teacher(batch, ctx.temperature)                       # [S, T]
    if ctx.critic is not None:
        batch.values = ctx.critic.values(batch)                                            # [S, T]
    batch.extras[ALL_REDUCE_SUM] = partial(all_reduce_sum, device=ctx.device)
    if not old_logprobs:
        return None
    return ctx.advantage_fn(batch).to(torch.float32)                                       # [S, T]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip_grad: Callable[[float], float],
               groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
    """Train on this rank's groups (collective: every rank calls it with the same number of groups).

    Returns metrics summed over ranks (loss metrics are global token means), averaged over minibatches.
    """
    if len(groups) % ctx.minibatches:
        raise ValueError(f"{len(groups)} groups per rank do not split into trainer.minibatches={ctx.minibatches}")
    samples = [s for g in groups for s in g]
    batch = build_train_batch(samples, ctx.pad_id, routes=ctx.routing_replay is not None)
    batch = batch_to(batch, ctx.device)
    batch.extras[ENTROPY_GRAD] = ctx.entropy_grad
    one_pass = uses_single_pass(ctx)
    skip = one_pass and ctx.skip_zero_advantage
    advantages = prepare_batch(model, batch, ctx, old_logprobs=not one_pass)               # [S, T] or None
    bounds = row_bounds([len(g) for g in groups], len(groups) // ctx.minibatches, ctx.minibatches)
    totals: dict[str, float] = {}
    for lo, hi in bounds:
        if one_pass:                     # the whole batch is the minibatch
            mb = batch
        else:
            assert advantages is not None
            mb, mb_adv = _select_rows(batch, torch.arange(lo, hi, device=ctx.device), advantages)
        counts = all_reduce_sum([float(mb.response_mask.sum()), float(hi - lo),
                                 float((mb.response_mask.sum(1) > 0).sum())], ctx.device)
        token_count = counts[0]
        mb.extras[ROW_COUNT], mb.extras[SEQ_COUNT] = counts[1], counts[2]
        if skip:
            mb_adv = ctx.advantage_fn(mb).to(torch.float32)                                # [S, T]
            mb, mb_adv, totals["zero_advantage_rows"] = _trained_rows(mb, mb_adv, ctx.device)
        logprobs = _logprobs(model, mb, ctx)                                               # [S', T]
        if one_pass:
            mb.old_logprobs = logprobs.detach()                                            # [S', T]
            if not skip:
                mb_adv = ctx.advantage_fn(mb).to(torch.float32)                            # [S, T]
        out = ctx.loss_fn(logprobs, mb_adv, mb, token_count)
        # FSDP averages gradients over ranks; the loss is already this rank's share of the global mean.
        (out.loss * ctx.world_size).backward()
        call_hooks(ctx.hooks, "before_step", step, mb)
        grad_norm = optimizer_step(optimizer, clip_grad(ctx.grad_clip), step, totals)   # global norm: same branch
        metrics = {k: float(v) for k, v in out.metrics.items()}
        if ctx.critic is not None:
            metrics.update(ctx.critic.train_minibatch(mb, mb.extras[RETURNS], token_count, ctx.world_size,
                                                      ctx.grad_clip))
        reduced = reduce_over_ranks({"loss": float(out.loss.detach()), **metrics},
                                    partial(all_reduce_sum, device=ctx.device),
                                    partial(all_reduce_max_floats, device=ctx.device))
        add_minibatch(totals, reduced, grad_norm, len(bounds))
    add_batch_counts(totals, len(samples), batch, partial(all_reduce_sum, device=ctx.device))
    finite_extremes(totals)
    return totals


def _trained_rows(batch: TrainBatch, advantages: torch.Tensor, device: torch.device
                  ) -> tuple[TrainBatch, torch.Tensor, float]:
    """The rows whose advantage is nonzero at some valid token, for a loss that is 0 with no gradient at a zero
    advantage (a GRPO group whose samples all scored the same adds nothing): (sub-batch, its advantages [S', T],
    the global fraction of rows left out). The loss keeps dividing by the whole batch's counts (extras and
    token_count, set before), so it and its gradients are unchanged; metric_token_count makes the policy metrics
    means over the rows kept. A rank keeps at least one row: every parameter then gets its (zero) gradient, so
    the optimizer steps exactly as with the whole batch, and FSDP's collectives run on every rank."""
    valid = batch.response_mask > 0                                                      # [S, T]
    live = ((advantages != 0) & valid).any(dim=1)                                       # [S]
    rows = live.nonzero().flatten()                                                     # [S']
    if rows.numel() == 0:
        rows = torch.zeros(1, dtype=torch.long, device=live.device)
    total, left_out, tokens = all_reduce_sum([float(live.numel()), float((~live).sum()),
                                             float(batch.response_mask[rows].sum())], device)
    if rows.numel() == live.numel():
        batch.extras[METRIC_TOKENS] = tokens
        return batch, advantages, left_out / max(total, 1.0)
    sub = select_rows(batch, rows, trim=True)
    sub.extras[METRIC_TOKENS] = tokens
    return sub, advantages[rows], left_out / max(total, 1.0)


def row_bounds(group_sizes: Sequence[int], groups_per_mb: int, count: int) -> list[tuple[int, int]]:
    """Row ranges [lo, hi) of each minibatch, which holds groups_per_mb whole groups."""
    bounds, lo = [], 0
    for i in range(count):
        hi = lo + sum(group_sizes[i * groups_per_mb:(i + 1) * groups_per_mb])
        bounds.append((lo, hi))
        lo = hi
    return bounds
