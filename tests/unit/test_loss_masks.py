"""TRL's entropy mask (top_entropy_quantile) and off-policy sequence mask (off_policy_mask_threshold) against TRL's
_compute_loss written out here in plain torch: per_token_loss = -min(r A, clip(r) A) * mask, aggregated with the
unmasked token count (loss_type bnpo), the KL term added unmasked; loss and gradient."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

from rlfleet.config import TrainerConfig
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.entropy import ENTROPY
from tests.support.train_batches import train_batch

LOGP = [[-1.0, -2.0, -0.5, -0.3], [-0.2, -3.0, -1.0, -2.0], [-1.5, -1.1, -0.9, -1.0]]
OLD = [[-1.1, -1.6, -0.5, -0.4], [-0.1, -2.7, -0.9, -2.0], [-1.2, -1.0, -1.0, -1.0]]
ROLL = [[-0.9, -1.2, -0.4, -0.4], [-0.5, -3.1, -1.6, -2.0], [-0.2, -0.1, -0.6, -1.0]]
REF = [[-0.4, -2.9, -0.7, -0.1], [-0.9, -2.0, -0.2, -2.6], [-1.0, -1.8, -1.9, -1.0]]
ENT = [[3.0, 0.5, 1.0, 9.0], [0.1, 3.0, 0.7, 1.2], [1.5, 0.2, 2.2, 9.0]]   # 9.0: padding, never counted
ADV = [[-1.2, -1.2, -1.2, -1.2], [-0.8, -0.8, -0.8, -0.8], [0.5, 0.5, 0.5, 0.5]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]


def _trl(logp: torch.Tensor, keep: torch.Tensor, beta: float = 0.0, entropy_coef: float = 0.0) -> torch.Tensor:
    mask = torch.tensor(MASK, dtype=torch.float32)
    r = torch.exp(logp - torch.tensor(OLD))
    adv = torch.tensor(ADV)
    per_token = -torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * keep
    d = torch.tensor(REF) - logp
    per_token = per_token + beta * (torch.exp(d) - d - 1)
    effective = mask * keep                    # TRL 1.16: the entropy bonus is a mean over the entropy-kept tokens
    bonus = (torch.tensor(ENT) * effective).sum() / effective.sum().clamp(min=1.0)
    return (per_token * mask).sum() / mask.sum() - entropy_coef * bonus


def _ours(cfg: TrainerConfig) -> tuple[float, torch.Tensor, Mapping[str, float]]:
    _, loss_fn = resolve(cfg)
    logp = torch.tensor(LOGP, requires_grad=True)
    batch = train_batch(MASK, rollout=ROLL, old=OLD, ref=REF, extras={ENTROPY: torch.tensor(ENT)})
    out = loss_fn(logp, torch.tensor(ADV), batch, 10.0)
    out.loss.backward()
    assert logp.grad is not None
    return out.loss.item(), logp.grad, out.metrics


def _check(cfg: TrainerConfig, keep: torch.Tensor, beta: float = 0.0, entropy_coef: float = 0.0) -> Mapping[str, float]:
    loss, grad, metrics = _ours(cfg)
    logp = torch.tensor(LOGP, requires_grad=True)
    ref = _trl(logp, keep, beta, entropy_coef)
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(grad, logp.grad, atol=1e-6, rtol=0)
    return metrics


BASE = {"convention": "trl", "tis": {"mode": "none"}, "policy_loss": {"agg": "bnpo"}}


@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_entropy_mask_trains_only_the_top_entropy_tokens(quantile: float) -> None:
    valid = torch.tensor(MASK) > 0
    entropies = torch.tensor(ENT)[valid]                              # TRL: torch.quantile of the valid entropies
    threshold = torch.quantile(entropies, 1 - quantile)
    keep = ((torch.tensor(ENT) >= threshold) & valid).float()
    assert 0 < keep.sum() < valid.sum()
    metrics = _check(TrainerConfig(**BASE, masking={"top_entropy_quantile": quantile}, kl={"coef": 0.04}), keep,
                     beta=0.04)
    assert metrics["entropy_mask_fraction"] == pytest.approx(float(keep.sum() / valid.sum()), abs=1e-6)
    # with an entropy bonus: TRL's bonus covers the kept tokens only
    base = {**BASE, "policy_loss": {"agg": "bnpo", "entropy_coef": 0.1}}
    _check(TrainerConfig(**base, masking={"top_entropy_quantile": quantile}), keep, entropy_coef=0.1)


def test_off_policy_sequence_mask_drops_negative_advantage_drifted_sequences() -> None:
    mask = torch.tensor(MASK, dtype=torch.float32)
    drift = ((torch.tensor(ROLL) - torch.tensor(LOGP)) * mask).sum(-1) / mask.sum(-1)   # mean log(pi_roll / pi)
    delta = 0.2
    keep_rows = (torch.tensor(ADV)[:, 0] >= 0) | (drift <= delta)
    assert keep_rows.tolist().count(False) == 1                       # row 0 drifted with A < 0; row 2 A >= 0
    keep = keep_rows[:, None].float().expand_as(mask)
    _check(TrainerConfig(**BASE, masking={"off_policy_threshold": delta}), keep)
    _check(TrainerConfig(**BASE), torch.ones_like(mask))              # off: nothing masked
