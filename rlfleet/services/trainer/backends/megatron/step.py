"""One optimizer step of the Megatron backend, through megatron-core's forward/backward schedules (pipelined when
pp > 1). The same plugins and aggregation as rlfleet/services/trainer/step.py: advantages over this data-parallel rank's
batch, each loss a share of the global token mean of its minibatch, metrics summed over data-parallel ranks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.advantages import ALL_REDUCE_SUM
from rlfleet.services.trainer.backends.megatron.convert import Layout
from rlfleet.services.trainer.backends.megatron.logprobs import parallel_response_logprobs
from rlfleet.services.trainer.batch import batch_to, build_train_batch, select_rows
from rlfleet.services.trainer.collectives import broadcast_bytes
from rlfleet.services.trainer.hooks import call_hooks
from rlfleet.services.trainer.losses import ROW_COUNT, SEQ_COUNT
from rlfleet.services.trainer.metric_reduce import combine, empty_value, finite_extremes, reduce_over_ranks
from rlfleet.services.trainer.step import StepContext, row_bounds
from rlfleet.services.trainer.step_totals import add_batch_counts, add_minibatch, optimizer_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepModel:
    """What a step needs of the backend: the stage's model, its optimizer and where this rank sits."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    layout: Layout
    dp_rank: int
    dp_size: int
    vocab_size: int
    microbatches: int                        # schedule microbatches per minibatch (pipelining depth)
    metrics_src: int                         # global rank of (last stage, tp 0, dp 0)
    reduce_and_clip: Callable[[float], float]


@dataclass
class _Micro:
    batch: TrainBatch                        # rows of one microbatch, columns trimmed to its longest row
    advantages: torch.Tensor | None          # [S', T]; None in the old-logprob pass
    token_count: float


def _micro_rows(lo: int, hi: int, count: int, device: torch.device) -> list[torch.Tensor]:
    rows = torch.arange(lo, hi, device=device)
    return [r for r in torch.tensor_split(rows, min(count, max(hi - lo, 1))) if r.numel()]



class MegatronStep:
    """Runs train steps on one rank; every rank of the trainer calls `__call__` with its data-parallel groups."""

    def __init__(self, parts: StepModel) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.p = parts
        self.schedule = get_forward_backward_func()

    # -- the schedule's callbacks ---------------------------------------------------------------------------------

    def _vocab_start(self, logits: torch.Tensor) -> int:
        return self.p.layout.tp_rank * logits.shape[-1]

    def _forward_step(self, ctx: StepContext, data: Iterator[_Micro], model: torch.nn.Module
                      ) -> tuple[torch.Tensor, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, dict]]]:
        micro = next(data)
        ids = micro.batch.input_ids                                                  # [S', L']
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :].expand_as(ids)
        output = model(ids, positions, None)              # last stage: logits [S', L', V/tp]; else hidden states
        return output, partial(self._loss, ctx, micro)

    def _loss(self, ctx: StepContext, micro: _Micro, logits: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        logprobs = parallel_response_logprobs(logits, micro.batch, ctx.temperature, self.p.vocab_size,
                                              self._vocab_start(logits))                 # [S', T]
        tokens = micro.batch.response_mask.sum().to(torch.int)
        if micro.advantages is None:
            return logprobs.sum() * 0.0, tokens, {"logprobs": logprobs.detach()}
        out = ctx.loss_fn(logprobs, micro.advantages, micro.batch, micro.token_count)
        values = {"loss": float(out.loss.detach()), **{k: float(v) for k, v in out.metrics.items()}}
        return out.loss, tokens, {"values": values}

    def _run(self, ctx: StepContext, micros: list[_Micro], forward_only: bool) -> list[dict[str, Any]]:
        longest = max(m.batch.input_ids.shape[1] for m in micros)
        rows = max(m.batch.input_ids.shape[0] for m in micros)
        return self.schedule(forward_step_func=partial(self._forward_step, ctx), data_iterator=iter(micros),
                             model=[self.p.model], num_microbatches=len(micros), seq_length=longest,
                             micro_batch_size=rows, forward_only=forward_only)

    # -- pieces of a step -----------------------------------------------------------------------------------------

    def _dp_sum(self, values: Sequence[float], device: torch.device) -> list[float]:
        """Elementwise sum over the data-parallel group (what all_reduce_sum is to the FSDP step)."""
        from megatron.core import parallel_state

        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        if self.p.dp_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=parallel_state.get_data_parallel_group())
        return t.cpu().tolist()

    def _old_logprobs(self, ctx: StepContext, batch: TrainBatch) -> torch.Tensor:
        """No-grad logprobs of the whole batch [S, T], on every rank (broadcast from the last stage)."""
        from megatron.core import parallel_state

        n = batch.input_ids.shape[0]
        micros = [_Micro(select_rows(batch, r, trim=True), None, 0.0) for r in _micro_rows(0, n, self.p.microbatches,
                                                                               ctx.device)]
        with torch.no_grad():
            store = self._run(ctx, micros, forward_only=True) if micros else []
        if self.p.layout.last_stage:
            old = torch.cat([s["logprobs"] for s in store]) if store else batch.response_mask.new_zeros((n, 0))
        else:
            old = torch.zeros_like(batch.response_mask)
        if self.p.layout.pp > 1:
            dist.broadcast(old, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                           group=parallel_state.get_pipeline_model_parallel_group())
        return old                                                                    # [S, T]

    def _global_metrics(self, values: dict[str, float] | None, device: torch.device) -> dict[str, float]:
        """Loss metrics summed over data-parallel ranks, known to every rank (only the last stage computed them)."""
        lay = self.p.layout
        names = sorted(values) if values is not None else []
        if lay.pp > 1:
            src_names = "\n".join(names).encode() if dist.get_rank() == self.p.metrics_src else None
            names = [n for n in broadcast_bytes(src_names, device, src=self.p.metrics_src).decode().split("\n") if n]
        counts = lay.last_stage and lay.tp_rank == 0 and values is not None
        mine = {k: values[k] if counts and values is not None else empty_value(k) for k in names}

        def world(op: dist.ReduceOp, vals: Sequence[float]) -> list[float]:
            vec = torch.tensor(list(vals), dtype=torch.float64, device=device)
            if dist.get_world_size() > 1 and vec.numel():
                dist.all_reduce(vec, op=op)
            return vec.cpu().tolist()

        return reduce_over_ranks(mine, partial(world, dist.ReduceOp.SUM), partial(world, dist.ReduceOp.MAX))

    def __call__(self, groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
        if len(groups) % ctx.minibatches:
            raise ValueError(f"{len(groups)} groups per rank do not split into trainer.minibatches={ctx.minibatches}")
        samples = [s for g in groups for s in g]
        batch = batch_to(build_train_batch(samples, ctx.pad_id), ctx.device)
        call_hooks(ctx.hooks, "before_logprobs", batch)
        self.p.model.train()
        batch.old_logprobs = self._old_logprobs(ctx, batch)                          # [S, T]
        batch.extras[ALL_REDUCE_SUM] = partial(self._dp_sum, device=ctx.device)      # global sums for estimators
        advantages = ctx.advantage_fn(batch).to(torch.float32)                        # [S, T]
        bounds = row_bounds([len(g) for g in groups], len(groups) // ctx.minibatches, ctx.minibatches)
        totals: dict[str, float] = {}
        for lo, hi in bounds:
            mask = batch.response_mask[lo:hi]                                                   # [S', T]
            token_count, row_count, seq_count = self._dp_sum(
                [float(mask.sum()), float(hi - lo), float((mask.sum(1) > 0).sum())], ctx.device)
            micros = []
            for rows in _micro_rows(lo, hi, self.p.microbatches, ctx.device):
                micro = select_rows(batch, rows, trim=True)
                micro.extras = {**micro.extras, ROW_COUNT: row_count, SEQ_COUNT: seq_count}
                micros.append(_Micro(micro, advantages[rows], token_count))
            store = self._run(ctx, micros, forward_only=False) if micros else []
            values: dict[str, float] | None = None
            if self.p.layout.last_stage:
                values = {}
                for entry in store:
                    for k, v in entry["values"].items():
                        values[k] = combine(k, values[k], v) if k in values else v
            whole = select_rows(batch, torch.arange(lo, hi, device=ctx.device), trim=True)
            call_hooks(ctx.hooks, "before_step", step, whole)
            # global norm: every rank takes the same branch
            grad_norm = optimizer_step(self.p.optimizer, self.p.reduce_and_clip(ctx.grad_clip), step, totals)
            add_minibatch(totals, self._global_metrics(values, ctx.device), grad_norm, len(bounds))
        add_batch_counts(totals, len(samples), batch, partial(self._dp_sum, device=ctx.device))
        finite_extremes(totals)
        return totals
