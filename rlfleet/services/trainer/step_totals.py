"""What both training steps (FSDP's step.py, Megatron's backends/megatron/step.py) do the same way around each
minibatch: the optimizer step that a non-finite gradient norm skips, the per-minibatch metrics averaged into the
step's, and the batch counts every step reports. One copy, so the two backends report the same metrics."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import torch

from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.metric_reduce import combine, empty_value, extreme
from rlfleet.services.trainer.token_versions import version_sums, version_totals

log = logging.getLogger(__name__)


def effective_sample_size(metrics: Mapping[str, float]) -> float | None:
    """Normalised ESS of the importance weights, (E w)^2 / E w^2 in (0, 1], from global token means."""
    mean, sq = metrics.get("tis_weight_mean"), metrics.get("tis_weight_sq_mean")
    if mean is None or sq is None or sq <= 0:
        return None
    return mean * mean / sq


def optimizer_step(optimizer: torch.optim.Optimizer, grad_norm: float, step: int, totals: dict[str, float]) -> float:
    """Step unless the (global) gradient norm is not finite, then clear the gradients. A skipped update counts in
    totals["skipped_updates"] and reports a norm of 0. Returns the norm to report."""
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        log.warning("step %d: gradient norm is %s; optimizer step skipped", step, grad_norm)
        totals["skipped_updates"] = totals.get("skipped_updates", 0.0) + 1.0
        grad_norm = 0.0
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def add_minibatch(totals: dict[str, float], mb_totals: dict[str, float], grad_norm: float, minibatches: int) -> None:
    """Average one minibatch's global metrics (and its ESS, where importance weights were logged) into the step's."""
    ess = effective_sample_size(mb_totals)
    if ess is not None:
        mb_totals["ess"] = ess
    for key, value in mb_totals.items():
        if extreme(key) is not None:                                          # min / max over minibatches
            totals[key] = combine(key, totals.get(key, empty_value(key)), value)
        else:
            totals[key] = totals.get(key, 0.0) + value / minibatches         # mean over minibatches
    totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm / minibatches


def add_batch_counts(totals: dict[str, float], samples: int, batch: TrainBatch,
                     sum_ranks: Callable[[Sequence[float]], Sequence[float]]) -> None:
    """The step's sample and token counts, mean reward and weight-version spread, summed over data-parallel ranks."""
    counts = sum_ranks([float(samples), float(batch.response_mask.sum()), float(batch.rewards.sum())])
    totals.update(samples=counts[0], tokens=counts[1], reward_mean=counts[2] / max(counts[0], 1.0))
    totals.update(version_totals(sum_ranks(version_sums(batch))))
