"""GSPO with rollout correction at each trainer.tis.level and under token-mean aggregation, against verl's
compute_policy_loss_gspo written out here in plain torch (per token: s_i,t = exp(sg[mean log-ratio] + logp_t -
sg[logp_t]), loss_t = max(-A s, -A clip(s)) * w_t, then agg_loss), loss and gradient; the three levels give three
different losses (they gave one before issue 42)."""

from __future__ import annotations

import pytest
import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.losses import GspoLoss
from tests.support.train_batches import train_batch

LOGP = [[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0], [-1.5, -1.1, -0.9]]
OLD = [[-1.1, -1.6, -0.5], [-0.1, -3.1, -1.2], [-1.2, -1.0, -1.0]]
ROLL = [[-1.6, -1.3, -0.1], [-0.6, -3.0, -2.0], [-1.0, -1.9, -1.1]]
ADV = [[1.2, 1.2, 1.2], [0.8, 0.8, 0.8], [-0.5, -0.5, -0.5]]   # row 1: s > 1 + high, clipped
MASK = [[1, 1, 0], [1, 1, 1], [1, 1, 1]]


def _verl_weights(level: str, clip: float) -> torch.Tensor:
    """verl's rollout-correction weights (truncated IS): per token exp(old - rollout), the sequence's product or its
    geometric mean, truncated at clip; [S, T]."""
    mask = torch.tensor(MASK, dtype=torch.float32)
    diff = (torch.tensor(OLD) - torch.tensor(ROLL)) * mask
    if level == "token":
        return torch.clamp(torch.exp(diff), max=clip)
    seq = diff.sum(-1) if level == "sequence" else diff.sum(-1) / mask.sum(-1)
    return torch.clamp(torch.exp(seq), max=clip)[:, None].expand_as(diff)


def _verl_gspo(logp: torch.Tensor, weights: torch.Tensor, low: float, high: float, agg: str) -> torch.Tensor:
    mask = torch.tensor(MASK, dtype=torch.float32)
    adv = torch.tensor(ADV)
    neg_kl = logp - torch.tensor(OLD)
    seq = (neg_kl * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(logp - logp.detach() + seq.detach()[:, None])
    pg = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - low, 1 + high)) * weights
    if agg == "token-mean":
        return (pg * mask).sum() / mask.sum()
    return ((pg * mask).sum(-1) / mask.sum(-1)).mean()


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_gspo_honours_the_tis_level_like_verl(level: str, agg: str) -> None:
    tis = TisConfig(mode="tis", clip=1.5, level=level)
    _, loss_fn = resolve(TrainerConfig(algorithm="gspo", tis=tis, gspo={"clip": (0.05, 0.05)},
                                       policy_loss={"agg": agg}))
    logp = torch.tensor(LOGP, requires_grad=True)
    out = loss_fn(logp, torch.tensor(ADV), train_batch(MASK, rollout=ROLL, old=OLD), 8.0)
    out.loss.backward()
    ref_logp = torch.tensor(LOGP, requires_grad=True)
    ref = _verl_gspo(ref_logp, _verl_weights(level, 1.5), 0.05, 0.05, agg)
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(logp.grad, ref_logp.grad, atol=1e-6, rtol=0)
    weights = _verl_weights(level, 1.5)[torch.tensor(MASK) > 0]
    assert out.metrics["tis_weight_min"] == pytest.approx(weights.min().item(), abs=1e-6)
    assert out.metrics["tis_weight_max"] == pytest.approx(weights.max().item(), abs=1e-6)


def test_the_three_levels_give_three_losses() -> None:
    losses = []
    for level in ("token", "sequence", "geometric"):
        out = GspoLoss(tis=TisConfig(mode="tis", clip=1.5, level=level))(
            torch.tensor(LOGP), torch.tensor(ADV), train_batch(MASK, rollout=ROLL, old=OLD), 8.0)
        losses.append(out.loss.item())
    assert min(abs(a - b) for a, b in ((losses[0], losses[1]), (losses[1], losses[2]), (losses[0], losses[2]))) > 1e-3
