"""verl's other policy losses, each an `rlfleet.protocols.LossFn` (trainer.loss names; LOSS_NAMES in the SDK):

- cispo (MiniMax-M1, verl compute_policy_loss_cispo): loss_t = -sg[clip(r_t, 1 - low, 1 + high)] * A_t * logp_t;
  the clipped ratio carries no gradient, so every token keeps its log-prob gradient (clipped ones too).
- gpg (verl compute_policy_loss_gpg): loss_t = -A_t * logp_t, no ratio at all.
- clip_cov (verl compute_policy_loss_clip_cov): the clipped loss, with the gradient cut (loss_t * 0) on
  max(1, int(ratio * valid tokens)) tokens drawn at random among the tokens the clip did not already bound whose
  covariance cov_t = (A_t - mean A) * (logp_t - mean logp) lies in (lb, ub). No dual-clip (as verl).
- kl_cov (verl compute_policy_loss_kl_cov): the unclipped loss -A_t r_t, plus coef * |log r_t| on the
  max(1, int(ratio * valid tokens)) tokens with the largest covariance.

Every one multiplies the rollout-correction weights of trainer.tis (at its level) into the per-token loss and
aggregates it by trainer.policy_loss.agg (default token-mean), as verl does; the covariance means are over this
rank's minibatch (verl: its micro-batch). Metrics: pg_loss, ppo_kl and the off-policy metrics of losses.py, plus
clip_fraction (cispo: tokens whose ratio was clipped; clip_cov: tokens whose gradient was cut).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch
from rlfleet.services.trainer.losses import (
    LOG_RATIO_CLAMP,
    _old,
    _token_share,
    aggregate,
    canonical_agg,
    metric_tokens,
    off_policy_metrics,
    rollout_weights,
)


@dataclass(frozen=True)
class _Common:
    """What every variant shares: rollout correction, aggregation, the empty-row rule, the log-ratio clamp."""

    tis: TisConfig = TisConfig()
    agg: str = "token-mean"
    max_tokens: int = 0
    empty_rows: str = "exclude"
    log_ratio_clamp: float = LOG_RATIO_CLAMP

    def __post_init__(self) -> None:
        object.__setattr__(self, "agg", canonical_agg(self.agg))

    def finish(self, per_token: torch.Tensor, logprobs: torch.Tensor, batch: TrainBatch, token_count: float,
               extra: dict[str, float]) -> LossOutput:
        """per_token [S, T] times the rollout weights, aggregated; the metrics every variant reports."""
        valid = batch.response_mask > 0                                               # [S, T]
        old = _old(logprobs, batch)
        weights, clipped, seq_metrics = rollout_weights(old, batch.rollout_logprobs, batch, self.tis)
        loss = aggregate(per_token * weights, batch, token_count, self.agg, self.empty_rows, self.max_tokens)
        share = _token_share(valid, metric_tokens(batch, token_count))
        metrics = {
            "pg_loss": float(loss.detach()),
            "ppo_kl": float(share(old - logprobs.detach())),
            **extra,
            **off_policy_metrics(share, old, batch.rollout_logprobs, weights, clipped, valid),
            **seq_metrics,
        }
        return LossOutput(loss=loss, metrics=metrics)

    def log_ratio(self, logprobs: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        return torch.clamp(logprobs - _old(logprobs, batch), -self.log_ratio_clamp, self.log_ratio_clamp)


def _covariance(advantages: torch.Tensor, logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(A_t - mean A)(logp_t - mean logp), means over the valid tokens; [S, T] without grad."""
    a, lp = advantages.detach().float(), logprobs.detach().float()
    n = valid.sum().clamp(min=1)
    zero = torch.zeros((), device=a.device)
    mean_a = torch.where(valid, a, zero).sum() / n
    mean_lp = torch.where(valid, lp, zero).sum() / n
    return (a - mean_a) * (lp - mean_lp)


def _count(ratio: float, valid: torch.Tensor) -> int:
    """verl's max(1, int(ratio * valid tokens))."""
    return max(int(ratio * float(valid.sum())), 1)


@dataclass(frozen=True)
class CispoLoss(_Common):
    """CISPO: -sg[clip(r, 1 - clip_low, 1 + clip_high)] * A * logp per token (see the module doc)."""

    clip_low: float = 0.2
    clip_high: float = 0.2

    @property
    def zero_at_zero_advantage(self) -> bool:
        """-w * 0 * logp is 0 with no gradient; sequence-level TIS reads whole rows."""
        return self.tis.level == "token"

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        ratio = torch.exp(self.log_ratio(logprobs, batch)).detach()                  # [S, T]
        bounded = torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)     # [S, T]
        per_token = -bounded * advantages * logprobs                                  # [S, T]
        share = _token_share(batch.response_mask > 0, metric_tokens(batch, token_count))
        return self.finish(per_token, logprobs, batch, token_count,
                           {"clip_fraction": float(share(ratio != bounded))})


@dataclass(frozen=True)
class GpgLoss(_Common):
    """GPG: -A * logp per token (see the module doc)."""

    @property
    def zero_at_zero_advantage(self) -> bool:
        return self.tis.level == "token"

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        return self.finish(-advantages * logprobs, logprobs, batch, token_count, {})


@dataclass(frozen=True)
class ClipCovLoss(_Common):
    """Clip-Cov: the clipped loss with the gradient cut on a random few high-covariance tokens (module doc)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio: float = 2e-4
    lb: float = 1.0
    ub: float = 5.0
    generator: torch.Generator | None = None      # the draw among the candidates (None: torch's default)

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        valid = batch.response_mask > 0                                               # [S, T]
        r = torch.exp(self.log_ratio(logprobs, batch))                                # [S, T]
        unclipped = -advantages * r
        clipped = -advantages * torch.clamp(r, 1.0 - self.clip_low, 1.0 + self.clip_high)
        by_clip = (clipped > unclipped) & valid                                       # [S, T]
        cov = _covariance(advantages, logprobs, valid)                                # [S, T]
        candidates = ((cov > self.lb) & (cov < self.ub) & valid & ~by_clip).flatten().nonzero().flatten()
        keep = torch.ones(valid.numel(), device=valid.device)                         # [S*T]
        if candidates.numel():
            order = torch.randperm(candidates.numel(), generator=self.generator).to(candidates.device)
            keep[candidates[order[:_count(self.ratio, valid)]]] = 0.0
        keep = keep.view_as(r)                                                        # [S, T]
        per_token = torch.maximum(unclipped, clipped) * keep
        share = _token_share(valid, metric_tokens(batch, token_count))
        return self.finish(per_token, logprobs, batch, token_count, {"clip_fraction": float(share(keep == 0))})


@dataclass(frozen=True)
class KlCovLoss(_Common):
    """KL-Cov: -A r, plus coef * |log r| on the largest-covariance tokens (module doc)."""

    ratio: float = 2e-4
    coef: float = 1.0

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        valid = batch.response_mask > 0                                               # [S, T]
        log_r = self.log_ratio(logprobs, batch)                                       # [S, T]
        per_token = -advantages * torch.exp(log_r)                                    # [S, T]
        cov = _covariance(advantages, logprobs, valid).flatten()                      # [S*T]
        cells = valid.flatten().nonzero().flatten()                                   # valid positions
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if cells.numel():
            top = torch.topk(cov[cells], min(_count(self.ratio, valid), cells.numel())).indices
            penalised[cells[top]] = True
        penalised = penalised.view_as(valid)                                          # [S, T]
        per_token = torch.where(penalised, per_token + self.coef * log_r.abs(), per_token)
        share = _token_share(valid, metric_tokens(batch, token_count))
        extra = {"kl_cov_fraction": float(share(penalised)), "ppo_kl_abs": float(share(log_r.detach().abs()))}
        return self.finish(per_token, logprobs, batch, token_count, extra)


def _common(cfg: TrainerConfig) -> dict[str, Any]:
    p = cfg.policy_loss
    return {"tis": cfg.tis, "agg": p.agg or "token-mean", "max_tokens": cfg.drgrpo.max_tokens,
            "empty_rows": p.empty_rows, "log_ratio_clamp": p.log_ratio_clamp}


def cispo(cfg: TrainerConfig) -> LossFn:
    return CispoLoss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, **_common(cfg))


def gpg(cfg: TrainerConfig) -> LossFn:
    return GpgLoss(**_common(cfg))


def clip_cov(cfg: TrainerConfig) -> LossFn:
    c = cfg.clip_cov
    return ClipCovLoss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, ratio=c.ratio, lb=c.lb, ub=c.ub,
                       **_common(cfg))


def kl_cov(cfg: TrainerConfig) -> LossFn:
    return KlCovLoss(ratio=cfg.kl_cov.ratio, coef=cfg.kl_cov.coef, **_common(cfg))


# loss name -> factory taking the trainer config (the names are in rlfleet.config.LOSS_NAMES)
VARIANT_LOSSES: dict[str, Callable[[TrainerConfig], LossFn]] = {
    "cispo": cispo, "gpg": gpg, "clip_cov": clip_cov, "kl_cov": kl_cov,
}
