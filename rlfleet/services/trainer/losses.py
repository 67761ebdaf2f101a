"""Policy losses, each an `rlfleet.protocols.LossFn`. Built-in: the clipped policy-gradient loss (GRPO, DAPO's
clip-higher, PPO, REINFORCE++, RLOO, distillation) with verl's dual-clip, Dr. GRPO's constant-normalised sum, GSPO's
sequence-level ratio, SFT, a KL penalty against the reference model and an entropy term wrapped around any of them
(each aggregated as a token mean or like the policy loss: trainer.kl.agg, trainer.policy_loss.entropy_agg). verl's
other losses are in loss_variants.py, TRL's masks in loss_masks.py, the verl / TRL conventions in docs/algorithms.md.

Aggregation (`trainer.policy_loss.agg`, verl's `loss_agg_mode`; TRL's `loss_type` names are aliases) is over the
*global* batch, each rank returning its share so that the ranks' losses sum to the loss of the whole batch:
- token-mean: sum over valid tokens / global valid tokens (TRL bnpo, dapo);
- token-sum: sum over valid tokens;
- seq-mean-token-sum: sum over sequences of the sequence's token sum / global sequences;
- seq-mean-token-mean: sum over sequences of the sequence's token mean / global sequences (TRL grpo);
- seq-mean-token-sum-norm: sum over valid tokens / (global sequences * max_tokens) (Dr. GRPO, TRL dr_grpo;
  max_tokens = trainer.drgrpo.max_tokens, 0: the batch's T).
The one rule for empty responses (rows without a valid token): they add nothing to any numerator, and every
sequence-level denominator (the seq-mean modes, GSPO) counts only rows with at least one valid token
(`policy_loss.empty_rows: exclude`, verl's convention); `include` counts every row (TRL's). The trainer puts the global
counts in `batch.extras["seq_count"]` (rows with a valid token) and `batch.extras["row_count"]` (all rows).
Metrics follow the same rule (this rank's share of a global mean): the trainer sums them over ranks. When the trainer
leaves zero-advantage rows out of the forward (a loss whose `zero_at_zero_advantage` is true, the optional
rlfleet.protocols.ZeroAtZeroAdvantage; step.py), the loss still divides by the whole batch's counts, so it and its
gradient are unchanged, and the policy metrics (ratios, TIS, entropy) are means over the tokens that ran the forward
(`batch.extras["metric_token_count"]`).

Clamps (verl's bounds by default): the log-ratio log(pi/pi_old) to +-policy_loss.log_ratio_clamp before exp, the
rollout log-ratio the same, k3 to +-policy_loss.kl_clamp: no NaN or inf from extreme log-probs.

Rollout correction against the rollout engine's logprobs (`trainer.tis`): truncated importance sampling (tis) or
masked IS (icepop / mask: weight 0 outside [low, clip]), of the token ratio, the sequence ratio (product) or its
geometric mean; metrics is_ratio_mean (the raw token ratio), tis_weight_mean / tis_weight_sq_mean (-> effective
sample size, computed by the trainer), tis_weight_min / tis_weight_max (over the valid tokens), tis_clip_fraction
(tokens truncated or masked), logprob_abs_diff = |old - rollout|, and for the sequence levels tis_seq_ratio_mean (the
sequences' ratio, a global sequence mean). The clipped loss also reports TRL's per-sequence clip_fraction_low_min and
clip_fraction_high_max. A metric ending in _min / _max is an extreme, combined by min / max (metric_reduce.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlfleet.config import PolicyLossConfig, TisConfig, TrainerConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch, ZeroAtZeroAdvantage
from rlfleet.services.trainer.entropy import ENTROPY, high_entropy_mask

SEQ_COUNT = "seq_count"
ROW_COUNT = "row_count"
# batch.extras: the global valid tokens the policy metrics average over, when fewer rows ran the forward than the
# loss divides by (rows left out with a zero advantage: rlfleet/services/trainer/step.py); absent: token_count
METRIC_TOKENS = "metric_token_count"
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# TRL's loss_type names (same semantics) and rlfleet's former internal names
AGG_ALIASES = {"bnpo": "token-mean", "dapo": "token-mean", "grpo": "seq-mean-token-mean",
               "dr_grpo": "seq-mean-token-sum-norm", "token": "token-mean", "seq_sum_norm": "seq-mean-token-sum-norm"}
LOG_RATIO_CLAMP = 20.0      # verl's SAFETY_BOUND / negative_approx_kl clamp
KL_CLAMP = 10.0             # verl's low_var_kl clamp


def canonical_agg(name: str) -> str:
    mode = AGG_ALIASES.get(name, name)
    if mode not in AGG_MODES:
        raise ValueError(f"trainer.policy_loss.agg {name!r}: not one of {', '.join(AGG_MODES)} "
                         f"(aliases {', '.join(sorted(AGG_ALIASES))})")
    return mode


def sequence_count(batch: TrainBatch, empty_rows: str) -> float:
    """The global number of sequences a sequence-level mean divides by, under the empty-row rule (>= 1)."""
    valid_rows = float((batch.response_mask.sum(1) > 0).sum())
    if empty_rows == "include":
        return max(float(batch.extras.get(ROW_COUNT, batch.response_mask.shape[0])), 1.0)
    return max(float(batch.extras.get(SEQ_COUNT, valid_rows)), 1.0)


def aggregate(per_token: torch.Tensor, batch: TrainBatch, token_count: float, mode: str = "token-mean",
              empty_rows: str = "exclude", max_tokens: int = 0) -> torch.Tensor:
    """per_token [S, T] -> this rank's share of the global aggregate over the valid tokens (see the module doc)."""
    valid = batch.response_mask > 0                                                   # [S, T]
    x = torch.where(valid, per_token.to(torch.float32), torch.zeros((), device=per_token.device))
    if mode == "token-mean":
        return x.sum() / max(float(token_count), 1.0)
    if mode == "token-sum":
        return x.sum()
    seqs = sequence_count(batch, empty_rows)
    if mode == "seq-mean-token-sum":
        return x.sum() / seqs
    if mode == "seq-mean-token-mean":
        lengths = valid.sum(1).clamp(min=1).to(torch.float32)                          # [S]
        return (x.sum(1) / lengths).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        return x.sum() / (seqs * float(max_tokens or batch.response_mask.shape[1] or 1))
    raise ValueError(f"unknown aggregation {mode!r}")


def importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, tis: TisConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights of trainer vs rollout policy from log-probs (or summed / mean log-probs), elementwise.

    old_logprobs, rollout_logprobs: [S, T] (or [S] for sequence-level weights). Returns (weights float32 without
    grad, clipped bool), same shape. tis: w = min(exp(old - rollout), clip); icepop / mask: w = 1 where the ratio
    is in [low, clip], else 0; none: w = 1. The log-ratio is clamped to +-20 first.
    """
    log_ratio = (old_logprobs.detach().float() - rollout_logprobs.float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)                                                      # [S, T]
    if tis.mode == "tis":
        clipped = ratio > tis.clip
        return torch.clamp(ratio, max=tis.clip), clipped
    if tis.mode in ("icepop", "mask"):
        clipped = (ratio < tis.low) | (ratio > tis.clip)
        return (~clipped).to(torch.float32), clipped
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def rollout_weights(old: torch.Tensor, rollout: torch.Tensor, batch: TrainBatch, tis: TisConfig
                    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per-token rollout-correction weights [S, T] (no grad), where they were truncated / masked [S, T], and the
    sequence-level metrics. tis.level: token ratios, the sequence's product, or its geometric mean."""
    if tis.level == "token":
        weights, clipped = importance_weights(old, rollout, tis)
        return weights, clipped, {}
    valid = batch.response_mask > 0                                                   # [S, T]
    zero = torch.zeros((), device=old.device)
    diff = torch.where(valid, old.detach().float() - rollout.float(), zero).sum(1)    # [S] sum of log-ratios
    if tis.level == "geometric":
        diff = diff / valid.sum(1).clamp(min=1).to(torch.float32)
    seq_w, seq_clipped = importance_weights(diff, torch.zeros_like(diff), tis)        # [S]
    has = valid.any(1)
    seqs = sequence_count(batch, "exclude")
    seq_ratio = torch.exp(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    metrics = {"tis_seq_ratio_mean": float(torch.where(has, seq_ratio, zero).sum() / seqs)}
    shape = batch.response_mask.shape
    return seq_w[:, None].expand(shape), seq_clipped[:, None].expand(shape), metrics


def _old(logprobs: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    return batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()


def metric_tokens(batch: TrainBatch, token_count: float) -> float:
    """The denominator of the policy metrics' token means: the tokens that ran the forward (see METRIC_TOKENS)."""
    return float(batch.extras.get(METRIC_TOKENS, token_count))


def _token_share(valid: torch.Tensor, denom: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [S, T] -> this rank's part of the global mean over valid tokens (denom = global valid tokens)."""
    d = max(float(denom), 1.0)

    def share(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, x.to(torch.float32), torch.zeros((), device=x.device)).sum() / d

    return share


def masked_extreme(x: torch.Tensor, keep: torch.Tensor, largest: bool) -> float:
    """The max (largest) or min of x where keep; -inf / +inf when nothing is kept (the trainer reduces the ranks'
    values with max / min and reports 0 where no rank had one: metric_reduce.py)."""
    values = x.detach().float()[keep]
    if values.numel() == 0:
        return -math.inf if largest else math.inf
    return float(values.max() if largest else values.min())


def off_policy_metrics(share: Callable[[torch.Tensor], torch.Tensor], old: torch.Tensor, rollout: torch.Tensor,
                       weights: torch.Tensor, weight_clipped: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Ratio statistics of the trainer's vs the rollout engine's policy, as shares of global means, and the
    weights' min / max over the valid tokens (TRL's sampling/importance_sampling_ratio/min, /max)."""
    log_ratio = (old.detach().float() - rollout.float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return {
        "is_ratio_mean": float(share(torch.exp(log_ratio))),
        "tis_weight_mean": float(share(weights)),
        "tis_weight_sq_mean": float(share(weights * weights)),
        "tis_weight_min": masked_extreme(weights, valid, largest=False),
        "tis_weight_max": masked_extreme(weights, valid, largest=True),
        "tis_clip_fraction": float(share(weight_clipped)),
        "logprob_abs_diff": float(share((old.detach() - rollout).abs())),
    }


def sequence_clip_extremes(low: torch.Tensor, high: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """TRL's clip_ratio/low_min and clip_ratio/high_max: per sequence, the fraction of its tokens clipped low
    (high); then the smallest low and the largest high over the sequences with a valid token. low, high, valid
    [S, T] bool."""
    lengths = valid.sum(1)                                                            # [S]
    has = lengths > 0
    per_seq = lambda x: (x & valid).sum(1).float() / lengths.clamp(min=1)             # noqa: E731 - [S, T] -> [S]
    return {"clip_fraction_low_min": masked_extreme(per_seq(low), has, largest=False),
            "clip_fraction_high_max": masked_extreme(per_seq(high), has, largest=True)}


@dataclass(frozen=True)
class ClippedPolicyLoss:
    """PPO-style clipped surrogate with asymmetric clip range [1 - clip_low, 1 + clip_high] and verl's dual-clip,
    times the rollout-correction weights, aggregated by `agg` (see the module doc).

    r = exp(clamp(logp - old, +-log_ratio_clamp)); l = max(-A r, -A clip(r, 1 - low, 1 + high)); where A < 0 and
    clip_ratio_c > 0 the loss is min(l, -A c), so a runaway ratio of a negative-advantage token stops at -A c and
    gets no gradient. Metrics: pg_loss, ratio_mean, clip_fraction (either side), clip_fraction_low (r < 1 - low,
    A < 0), clip_fraction_high (r > 1 + high, A > 0), dual_clip_fraction, ppo_kl = mean(old - logp).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    tis: TisConfig = TisConfig()
    agg: str = "token-mean"
    max_tokens: int = 0
    clip_ratio_c: float = 3.0
    log_ratio_clamp: float = LOG_RATIO_CLAMP
    empty_rows: str = "exclude"

    @property
    def zero_at_zero_advantage(self) -> bool:
        """A token whose advantage is 0 adds 0 to this loss and to its gradient, whatever its logprob: -0 * r in
        both clip branches, no dual clip (A < 0 only), token TIS weights multiply it. Sequence-level TIS is left
        out (its weights and metric read whole rows)."""
        return self.tis.level == "token"

    def __post_init__(self) -> None:
        object.__setattr__(self, "agg", canonical_agg(self.agg))
        if 0 < self.clip_ratio_c <= 1.0:
            raise ValueError(f"trainer.policy_loss.clip_ratio_c must be > 1 (or 0: off), got {self.clip_ratio_c}")

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        # logprobs, advantages, batch.*_logprobs, batch.response_mask: [S, T]
        valid = batch.response_mask > 0                                                # [S, T] bool
        old = _old(logprobs, batch)
        share = _token_share(valid, metric_tokens(batch, token_count))   # metrics: always global token means

        log_ratio = torch.clamp(logprobs - old, -self.log_ratio_clamp, self.log_ratio_clamp)   # [S, T]
        ratio = torch.exp(log_ratio)                                                   # [S, T]
        unclipped = -advantages * ratio                                                # [S, T]
        clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(unclipped, clipped)                                  # [S, T]
        negative = advantages < 0
        dual = torch.zeros_like(valid)
        if self.clip_ratio_c > 0:
            cap = -advantages * self.clip_ratio_c                                      # [S, T]
            dual = negative & (per_token > cap)
            per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
        weights, weight_clipped, seq_metrics = rollout_weights(old, batch.rollout_logprobs, batch, self.tis)
        loss = aggregate(per_token * weights, batch, token_count, self.agg, self.empty_rows, self.max_tokens)
        r = ratio.detach()
        low, high = (r < 1.0 - self.clip_low) & negative, (r > 1.0 + self.clip_high) & (advantages > 0)
        metrics = {
            "pg_loss": float(loss.detach()),
            "ratio_mean": float(share(r)),
            "clip_fraction": float(share((clipped > unclipped).detach())),
            "clip_fraction_low": float(share(low)),
            "clip_fraction_high": float(share(high)),
            **sequence_clip_extremes(low, high, valid),
            "dual_clip_fraction": float(share(dual.detach())),
            "ppo_kl": float(share(-log_ratio.detach())),
            **off_policy_metrics(share, old, batch.rollout_logprobs, weights, weight_clipped, valid),
            **seq_metrics,
        }
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True)
class GspoLoss:
    """GSPO as verl computes it: per token the sequence ratio s_i = exp(mean_t(logp - old)) with the token's own
    gradient (log s_i,t = sg[log s_i] + logp_t - sg[logp_t]), loss_t = max(-A_t s_i, -A_t clip(s_i, 1 - low,
    1 + high)), times the rollout-correction weights of trainer.tis at its level (token ratios, the sequence's
    product or its geometric mean), aggregated by `agg` (verl's and this loss's default seq-mean-token-mean; verl's
    token-mean and every other mode too). clip_fraction counts sequences (TRL; the sequence's mean advantage
    decides its side) or tokens (verl): trainer.gspo.clip_fraction."""

    clip_low: float = 3e-4
    clip_high: float = 4e-4
    tis: TisConfig = TisConfig()
    empty_rows: str = "exclude"
    log_ratio_clamp: float = LOG_RATIO_CLAMP
    agg: str = "seq-mean-token-mean"
    max_tokens: int = 0
    clip_fraction: str = "sequence"

    def __post_init__(self) -> None:
        object.__setattr__(self, "agg", canonical_agg(self.agg))
        if self.clip_fraction not in ("sequence", "token"):
            raise ValueError(f"trainer.gspo.clip_fraction {self.clip_fraction!r}: sequence or token")

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        valid = batch.response_mask > 0                                               # [S, T]
        lengths = valid.sum(1)                                                        # [S]
        has = lengths > 0                                                             # [S]
        n = lengths.clamp(min=1).to(torch.float32)
        old = _old(logprobs, batch)
        zero = torch.zeros((), device=logprobs.device)
        mean_of = lambda x: torch.where(valid, x.float(), zero).sum(1) / n            # noqa: E731 - [S, T] -> [S]
        seq_log = mean_of(logprobs.detach() - old)                                    # [S] sg[log s_i]
        log_s = (logprobs - logprobs.detach() + seq_log[:, None]).clamp(-self.log_ratio_clamp, self.log_ratio_clamp)
        ratio = torch.exp(log_s)                                                      # [S, T] value s_i
        unclipped = -advantages * ratio                                               # [S, T]
        clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(unclipped, clipped)                                 # [S, T]
        weights, weight_clipped, seq_metrics = rollout_weights(old, batch.rollout_logprobs, batch, self.tis)
        loss = aggregate(per_token * weights, batch, token_count, self.agg, self.empty_rows, self.max_tokens)
        seqs = sequence_count(batch, self.empty_rows)
        seq_share = lambda x: torch.where(has, x.float(), zero).sum() / seqs         # noqa: E731 - [S] -> share
        share = _token_share(valid, metric_tokens(batch, token_count))
        seq_ratio = torch.exp(seq_log.clamp(-self.log_ratio_clamp, self.log_ratio_clamp))   # [S]
        if self.clip_fraction == "token":
            clip_fraction = share((clipped > unclipped).detach())
        else:
            adv = mean_of(advantages)                                                 # [S]
            bounded = torch.clamp(seq_ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
            clip_fraction = seq_share(-adv * bounded > -adv * seq_ratio)
        metrics = {
            "pg_loss": float(loss.detach()),
            "ratio_mean": float(seq_share(seq_ratio)),
            "clip_fraction": float(clip_fraction),
            "ppo_kl": float(share(old - logprobs.detach())),
            **off_policy_metrics(share, old, batch.rollout_logprobs, weights, weight_clipped, valid),
            **seq_metrics,
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


KL_NAMES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str,
                log_ratio_clamp: float = LOG_RATIO_CLAMP, kl_clamp: float = KL_CLAMP) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens. [S, T] -> [S, T]

    k1 (kl) = log(p/q); abs = |log(p/q)|; k2 (mse) = (log(p/q))^2 / 2; k3 (low_var_kl) = q/p - 1 - log(q/p) with
    log(q/p) clamped to +-log_ratio_clamp and the result to +-kl_clamp (verl's bounds; unbiased, non-negative, low
    variance). A trailing "+" (straight-through): the value of the estimator, the gradient of k2.
    """
    if estimator.endswith("+"):
        value = kl_estimate(logprobs, ref_logprobs, estimator[:-1], log_ratio_clamp, kl_clamp)
        k2 = kl_estimate(logprobs, ref_logprobs, "k2")
        return k2 - k2.detach() + value.detach()
    kind = KL_NAMES.get(estimator, estimator)
    log_ratio = logprobs.float() - ref_logprobs.float()
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio * log_ratio
    if kind == "k3":
        neg = torch.clamp(-log_ratio, -log_ratio_clamp, log_ratio_clamp)
        return torch.clamp(torch.exp(neg) - 1.0 - neg, -kl_clamp, kl_clamp)
    raise ValueError(f"unknown KL estimator {estimator!r} (k1/kl, k2/mse, k3/low_var_kl, abs, each with a '+')")


@dataclass(frozen=True)
class KlPenalizedLoss:
    """inner loss + coef * the KL estimate against batch.ref_logprobs, aggregated by `agg`: a global token mean
    (trainer.kl.agg token-mean) or the policy loss's mode (kl.agg policy: verl's agg_loss(kld, loss_agg_mode),
    TRL's per_token_loss + beta * per_token_kl), with `empty_rows` and `max_tokens` as the policy loss has them.

    ratio_weighted (TRL's use_bias_correction_kl): each token's KL times the ratio pi/pi_old (with its gradient), the
    importance correction for tokens sampled from pi_old. The metric kl is a global token mean of the plain
    estimate, or of the weighted one with logged "weighted" (TRL)."""

    inner: LossFn
    coef: float
    estimator: str = "k3"
    ratio_weighted: bool = False
    log_ratio_clamp: float = LOG_RATIO_CLAMP
    kl_clamp: float = KL_CLAMP
    agg: str = "token-mean"
    empty_rows: str = "exclude"
    max_tokens: int = 0
    logged: str = "plain"

    def __post_init__(self) -> None:
        object.__setattr__(self, "agg", canonical_agg(self.agg))

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        out = self.inner(logprobs, advantages, batch, token_count)
        if batch.ref_logprobs is None:
            raise ValueError("a KL penalty needs reference logprobs (trainer.kl.coef > 0 loads the reference model)")
        share = _token_share(batch.response_mask > 0, token_count)
        per_token = kl_estimate(logprobs, batch.ref_logprobs, self.estimator, self.log_ratio_clamp, self.kl_clamp)
        plain = per_token.detach()                                                    # [S, T]
        if self.ratio_weighted:
            log_ratio = torch.clamp(logprobs - _old(logprobs, batch), -self.log_ratio_clamp, self.log_ratio_clamp)
            per_token = per_token * torch.exp(log_ratio)                              # [S, T]
        logged = per_token.detach() if self.logged == "weighted" else plain
        kl = aggregate(per_token, batch, token_count, self.agg, self.empty_rows, self.max_tokens)
        return LossOutput(loss=out.loss + self.coef * kl, metrics={**out.metrics, "kl": float(share(logged))})


@dataclass(frozen=True)
class EntropyTerm:
    """inner loss - coef * the policy's entropy (from the logits: batch.extras["entropy"] [S, T], filled by the
    forward), aggregated by `agg`: a global token mean (TRL) or the policy loss's mode (verl's agg_loss(entropy,
    loss_agg_mode)); reports "entropy", a global token mean, as a metric whenever the forward provided it.
    top_entropy_quantile < 1 (trainer.masking): the bonus covers the tokens the entropy mask keeps (TRL 1.16's
    effective_mask), a mean over those tokens with token-mean aggregation (one data-parallel rank: the check)."""

    inner: LossFn
    coef: float = 0.0
    agg: str = "token-mean"
    empty_rows: str = "exclude"
    max_tokens: int = 0
    top_entropy_quantile: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "agg", canonical_agg(self.agg))

    @property
    def zero_at_zero_advantage(self) -> bool:
        """No entropy bonus, and the inner loss says so (an entropy bonus is never zero)."""
        return self.coef == 0 and isinstance(self.inner, ZeroAtZeroAdvantage) and self.inner.zero_at_zero_advantage

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        out = self.inner(logprobs, advantages, batch, token_count)
        entropy = batch.extras.get(ENTROPY)
        if not isinstance(entropy, torch.Tensor) or entropy.shape != batch.response_mask.shape:
            if self.coef > 0:
                raise ValueError("trainer.policy_loss.entropy_coef > 0 needs the forward's entropy "
                                 "(this backend does not provide it)")
            return out
        valid = batch.response_mask > 0
        loss = out.loss - self.coef * self._bonus(entropy, batch, token_count) if self.coef > 0 else out.loss
        mean = _token_share(valid, metric_tokens(batch, token_count))(entropy.detach())
        return LossOutput(loss=loss, metrics={**out.metrics, "entropy": float(mean)})

    def _bonus(self, entropy: torch.Tensor, batch: TrainBatch, token_count: float) -> torch.Tensor:
        """The aggregated entropy (entropy [S, T]) the bonus maximises."""
        if self.top_entropy_quantile >= 1.0:
            return aggregate(entropy, batch, token_count, self.agg, self.empty_rows, self.max_tokens)
        keep = high_entropy_mask(entropy, batch.response_mask > 0, self.top_entropy_quantile)     # [S, T]
        kept = torch.where(keep, entropy, torch.zeros((), device=entropy.device))
        if self.agg == "token-mean":
            return kept.sum() / max(float(keep.sum()), 1.0)
        return aggregate(kept, batch, token_count, self.agg, self.empty_rows, self.max_tokens)


def _clipped(cfg: TrainerConfig, clip_high: float, agg: str) -> ClippedPolicyLoss:
    p: PolicyLossConfig = cfg.policy_loss
    return ClippedPolicyLoss(clip_low=cfg.clip_low, clip_high=clip_high, tis=cfg.tis, agg=p.agg or agg,
                             max_tokens=cfg.drgrpo.max_tokens, clip_ratio_c=p.clip_ratio_c,
                             log_ratio_clamp=p.log_ratio_clamp, empty_rows=p.empty_rows)


def clipped_pg(cfg: TrainerConfig) -> LossFn:
    return _clipped(cfg, cfg.clip_high, "token-mean")


def dapo(cfg: TrainerConfig) -> LossFn:
    """DAPO: token-level clipped loss with clip-higher (1 - clip_low, 1 + dapo.clip_high)."""
    return _clipped(cfg, cfg.dapo.clip_high, "token-mean")


def drgrpo(cfg: TrainerConfig) -> LossFn:
    return _clipped(cfg, cfg.clip_high, "seq-mean-token-sum-norm")


def gspo(cfg: TrainerConfig) -> LossFn:
    return GspoLoss(clip_low=cfg.gspo.clip[0], clip_high=cfg.gspo.clip[1], tis=cfg.tis,
                    empty_rows=cfg.policy_loss.empty_rows, log_ratio_clamp=cfg.policy_loss.log_ratio_clamp,
                    agg=cfg.policy_loss.agg or "seq-mean-token-mean", max_tokens=cfg.drgrpo.max_tokens,
                    clip_fraction=cfg.gspo.clip_fraction)


def sft(cfg: TrainerConfig) -> LossFn:
    return SftLoss()


# a built-in loss's own aggregation when trainer.policy_loss.agg is null (the others: token-mean)
LOSS_AGG = {"drgrpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean"}


def policy_agg(cfg: TrainerConfig, loss_name: str) -> str:
    """The aggregation the policy loss `loss_name` uses under this config: policy_loss.agg, else the loss's own."""
    return canonical_agg(cfg.policy_loss.agg or LOSS_AGG.get(loss_name, "token-mean"))


def kl_penalized(loss: LossFn, cfg: TrainerConfig, loss_name: str) -> LossFn:
    """The KL penalty of trainer.kl around `loss`, aggregated as kl.agg says (like loss_name's aggregation)."""
    kl, p = cfg.kl, cfg.policy_loss
    agg = policy_agg(cfg, loss_name) if kl.agg == "policy" else "token-mean"
    return KlPenalizedLoss(loss, kl.coef, kl.estimator, kl.ratio_weighted, p.log_ratio_clamp, p.kl_clamp, agg,
                           p.empty_rows, cfg.drgrpo.max_tokens, kl.logged)


def entropy_term(loss: LossFn, cfg: TrainerConfig, loss_name: str) -> LossFn:
    """The entropy metric and bonus of trainer.policy_loss around `loss` (aggregated as entropy_agg says)."""
    p = cfg.policy_loss
    agg = policy_agg(cfg, loss_name) if p.entropy_agg == "policy" else "token-mean"
    return EntropyTerm(loss, p.entropy_coef, agg, p.empty_rows, cfg.drgrpo.max_tokens,
                       cfg.masking.top_entropy_quantile)


# built-in loss name -> factory taking the trainer config; the names are rlfleet.config.LOSS_NAMES
LOSSES: dict[str, Callable[[TrainerConfig], LossFn]] = {
    "clipped_pg": clipped_pg, "dapo": dapo, "drgrpo": drgrpo, "gspo": gspo, "sft": sft,
}
