"""Policy losses, each an `rlfleet.protocols.LossFn`. Built-in: the clipped policy-gradient loss (GRPO, DAPO's
clip-higher, PPO, REINFORCE++, distillation), Dr. GRPO's constant-normalised sum, GSPO's sequence-level ratio, SFT,
and a KL penalty against the reference model wrapped around any of them.

Aggregation is over the *global* batch: a token-level loss divides its sum over this rank's valid tokens by
`token_count`, the number of valid tokens on all data-parallel ranks together, so the sum of the ranks' losses is the
loss of the whole batch. Sequence-level losses divide by the global number of sequences, which the trainer puts in
`batch.extras["seq_count"]` (rows with at least one valid token) and `batch.extras["row_count"]` (all rows).
Metrics follow the same rule (this rank's share of a global mean): the trainer sums them over ranks.

Off-policy correction against the rollout engine's logprobs: truncated importance sampling (tis) or icepop, with
metrics is_ratio_mean (the raw ratio), tis_weight_mean / tis_weight_sq_mean (-> effective sample size, computed by
the trainer), tis_clip_fraction and logprob_abs_diff = |old - rollout|.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch

SEQ_COUNT = "seq_count"
ROW_COUNT = "row_count"


def importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, tis: TisConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights of trainer vs rollout policy, and where they were truncated.

    old_logprobs, rollout_logprobs: [S, T] (or [S] for sequence-level weights). Returns (weights float32 without
    grad, clipped bool), same shape. tis: w = min(exp(old - rollout), clip); icepop: w = 1 where the ratio is in
    [low, clip], else 0; none: w = 1.
    """
    ratio = torch.exp(old_logprobs.detach().float() - rollout_logprobs.float())     # [S, T]
    if tis.mode == "tis":
        clipped = ratio > tis.clip
        return torch.clamp(ratio, max=tis.clip), clipped
    if tis.mode == "icepop":
        clipped = (ratio < tis.low) | (ratio > tis.clip)
        return (~clipped).to(torch.float32), clipped
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def _old(logprobs: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    return batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()


def _token_share(valid: torch.Tensor, denom: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [S, T] -> this rank's part of the global mean over valid tokens (denom = global valid tokens)."""
    d = max(float(denom), 1.0)

    def share(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, x.to(torch.float32), torch.zeros((), device=x.device)).sum() / d

    return share


def off_policy_metrics(share: Callable[[torch.Tensor], torch.Tensor], old: torch.Tensor, rollout: torch.Tensor,
                       weights: torch.Tensor, weight_clipped: torch.Tensor) -> dict[str, float]:
    """Ratio statistics of the trainer's vs the rollout engine's policy, as shares of global means."""
    raw = torch.exp(old.detach().float() - rollout.float())
    return {
        "is_ratio_mean": float(share(raw)),
        "tis_weight_mean": float(share(weights)),
        "tis_weight_sq_mean": float(share(weights * weights)),
        "tis_clip_fraction": float(share(weight_clipped)),
        "logprob_abs_diff": float(share((old.detach() - rollout).abs())),
    }


@dataclass(frozen=True)
class ClippedPolicyLoss:
    """PPO-style clipped surrogate with asymmetric clip range [1 - clip_low, 1 + clip_high], times TIS weights.

    agg "token": sum over valid tokens / global valid tokens (GRPO, DAPO, PPO, REINFORCE++);
    agg "seq_sum_norm": sum over valid tokens / (global rows * max_tokens) (Dr. GRPO; max_tokens 0 = batch's T).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    tis: TisConfig = TisConfig()
    agg: str = "token"
    max_tokens: int = 0

    def _denominator(self, batch: TrainBatch, token_count: float) -> float:
        if self.agg == "token":
            return token_count
        rows = float(batch.extras.get(ROW_COUNT, batch.response_mask.shape[0]))
        return rows * float(self.max_tokens or batch.response_mask.shape[1])

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        # logprobs, advantages, batch.*_logprobs, batch.response_mask: [S, T]
        valid = batch.response_mask > 0                                                # [S, T] bool
        old = _old(logprobs, batch)
        share = _token_share(valid, token_count)                       # metrics: always global token means
        loss_share = _token_share(valid, self._denominator(batch, token_count))

        ratio = torch.exp(logprobs - old)                                              # [S, T]
        unclipped = -advantages * ratio                                                # [S, T]
        clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(unclipped, clipped)                                  # [S, T]
        weights, weight_clipped = importance_weights(old, batch.rollout_logprobs, self.tis)
        loss = loss_share(per_token * weights)
        metrics = {
            "pg_loss": float(loss.detach()),
            "ratio_mean": float(share(ratio.detach())),
            "clip_fraction": float(share((clipped > unclipped).detach())),
            **off_policy_metrics(share, old, batch.rollout_logprobs, weights, weight_clipped),
        }
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True)
class GspoLoss:
    """GSPO: one importance ratio per sequence, s_i = exp(mean_t(logp - old)), clipped to [1 - low, 1 + high];
    loss = mean over the global batch's sequences of -min(s_i A_i, clip(s_i) A_i), A_i = the mean token advantage.
    TIS at sequence level: w_i = weight of exp(mean_t(old - rollout))."""

    clip_low: float = 3e-4
    clip_high: float = 4e-4
    tis: TisConfig = TisConfig()

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        m = batch.response_mask.to(torch.float32)                                     # [S, T]
        valid = m > 0
        lengths = m.sum(1)                                                            # [S]
        has = lengths > 0                                                             # [S]
        n = lengths.clamp(min=1)
        old = _old(logprobs, batch)
        zero = torch.zeros((), device=logprobs.device)
        mean_of = lambda x: torch.where(valid, x.float(), zero).sum(1) / n            # noqa: E731 - [S, T] -> [S]
        log_s = mean_of(logprobs - old)                                               # [S]
        seq_ratio = torch.exp(log_s)                                                  # [S]
        adv = mean_of(advantages)                                                     # [S]
        unclipped = -adv * seq_ratio
        clipped = -adv * torch.clamp(seq_ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_seq = torch.maximum(unclipped, clipped)                                   # [S]
        weights, weight_clipped = importance_weights(mean_of(old), mean_of(batch.rollout_logprobs), self.tis)
        seqs = max(float(batch.extras.get(SEQ_COUNT, float(has.sum()))), 1.0)
        seq_share = lambda x: torch.where(has, x.float(), zero).sum() / seqs         # noqa: E731
        loss = seq_share(per_seq * weights)
        share = _token_share(valid, token_count)
        tok_w, tok_clipped = importance_weights(old, batch.rollout_logprobs, self.tis)
        metrics = {
            "pg_loss": float(loss.detach()),
            "ratio_mean": float(seq_share(seq_ratio.detach())),
            "clip_fraction": float(seq_share((clipped > unclipped).detach())),
            "seq_tis_weight_mean": float(seq_share(weights)),
            "seq_tis_clip_fraction": float(seq_share(weight_clipped)),
            **off_policy_metrics(share, old, batch.rollout_logprobs, tok_w, tok_clipped),
        }
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True)
class SftLoss:
    """Next-token negative log-likelihood of the response tokens, a global token mean (advantages ignored)."""

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        share = _token_share(batch.response_mask > 0, token_count)
        loss = share(-logprobs)
        return LossOutput(loss=loss, metrics={"nll": float(loss.detach())})


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens. [S, T] -> [S, T]

    k1 = log(p/q); k2 = (log(p/q))^2 / 2; k3 = q/p - 1 - log(q/p) (unbiased, non-negative, low variance).
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    if estimator == "k3":
        neg = -log_ratio
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"unknown KL estimator {estimator!r} (k1, k2, k3)")


@dataclass(frozen=True)
class KlPenalizedLoss:
    """inner loss + coef * global token mean of the KL estimate against batch.ref_logprobs."""

    inner: LossFn
    coef: float
    estimator: str = "k3"

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        out = self.inner(logprobs, advantages, batch, token_count)
        if batch.ref_logprobs is None:
            raise ValueError("a KL penalty needs reference logprobs (trainer.kl.coef > 0 loads the reference model)")
        share = _token_share(batch.response_mask > 0, token_count)
        kl = share(kl_estimate(logprobs, batch.ref_logprobs, self.estimator))
        return LossOutput(loss=out.loss + self.coef * kl, metrics={**out.metrics, "kl": float(kl.detach())})


def clipped_pg(cfg: TrainerConfig) -> LossFn:
    return ClippedPolicyLoss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, tis=cfg.tis)


def dapo(cfg: TrainerConfig) -> LossFn:
    """DAPO: token-level clipped loss with clip-higher (1 - clip_low, 1 + dapo_clip_high)."""
    return ClippedPolicyLoss(clip_low=cfg.clip_low, clip_high=cfg.dapo_clip_high, tis=cfg.tis)


def drgrpo(cfg: TrainerConfig) -> LossFn:
    return ClippedPolicyLoss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, tis=cfg.tis, agg="seq_sum_norm",
                             max_tokens=cfg.drgrpo_max_tokens)


def gspo(cfg: TrainerConfig) -> LossFn:
    return GspoLoss(clip_low=cfg.gspo_clip[0], clip_high=cfg.gspo_clip[1], tis=cfg.tis)


def sft(cfg: TrainerConfig) -> LossFn:
    return SftLoss()


# built-in loss name -> factory taking the trainer config
LOSSES: dict[str, Callable[[TrainerConfig], LossFn]] = {
    "clipped_pg": clipped_pg, "dapo": dapo, "drgrpo": drgrpo, "gspo": gspo, "sft": sft,
}
