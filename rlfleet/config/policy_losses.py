"""The trainer's sub-sections for verl's covariance losses (trainer.clip_cov, trainer.kl_cov) and TRL's masks of the
policy loss (trainer.masking). The losses live in rlfleet/services/trainer/loss_variants.py and loss_masks.py."""

from __future__ import annotations

from pydantic import Field

from rlfleet.config.section import Section


class ClipCovConfig(Section):
    """Clip-Cov (trainer.loss: clip_cov): the clipped loss with the gradient of a few high-covariance tokens cut."""

    ratio: float = Field(2e-4, gt=0, le=1, description="Fraction of the valid tokens whose gradient is cut (at "
                         "least one), drawn at random among the unclipped tokens whose covariance "
                         "(A - mean A)(logp - mean logp) lies in (lb, ub) (verl's clip_cov_ratio).")
    lb: float = Field(1.0, description="Lower bound of the covariance of a token that may be cut (verl's "
                      "clip_cov_lb).")
    ub: float = Field(5.0, description="Upper bound of the covariance of a token that may be cut (verl's "
                      "clip_cov_ub).")


class KlCovConfig(Section):
    """KL-Cov (trainer.loss: kl_cov): the unclipped loss plus coef * |log r| on the highest-covariance tokens."""

    ratio: float = Field(2e-4, gt=0, le=1, description="Fraction of the valid tokens (at least one) with the largest "
                         "covariance (A - mean A)(logp - mean logp) that get the |log r| penalty (verl's "
                         "kl_cov_ratio).")
    coef: float = Field(1.0, ge=0, description="Weight of the |log(pi/pi_old)| penalty (verl's ppo_kl_coef).")


class MaskingConfig(Section):
    """TRL's masks of the policy-loss term (the KL penalty and the entropy bonus are not masked, as in TRL)."""

    top_entropy_quantile: float = Field(1.0, gt=0, le=1, description="Train only on the tokens whose entropy is at "
                                        "or above the (1 - q) quantile of the batch's valid tokens (TRL's "
                                        "top_entropy_quantile; 1: every token). One data-parallel rank only: the "
                                        "quantile is of the whole batch.")
    off_policy_threshold: float | None = Field(None, description="Off-policy sequence masking (DeepSeek-V3.2, TRL's "
                                               "off_policy_mask_threshold): a sequence with a negative advantage "
                                               "whose mean log(pi_rollout / pi) exceeds this is left out of the "
                                               "policy loss. null: off.")
