"""The clipped policy-gradient loss with TIS / icepop against hand-computed values, and algorithm resolution."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.plugins import PluginError
from rlfleet.protocols import LossOutput, TrainBatch
from rlfleet.services.trainer.advantages import grpo
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.losses import ClippedPolicyLoss, EntropyTerm, importance_weights
from rlfleet.services.trainer.metric_reduce import empty_value
from tests.support.train_batches import train_batch


def _batch(mask: list[list[float]], old: list[list[float]], rollout: list[list[float]]) -> TrainBatch:
    return train_batch(mask, old=old, rollout=rollout)


# token 0: ratio 1; token 1: ratio e^0.5 (clipped at 1 + 0.28); token 2: masked, with extreme values
LOGP = [[-1.0, -2.0, -1e4]]
OLD = [[-1.0, -2.5, 0.0]]
ROLLOUT = [[-1.5, -2.5, 50.0]]
MASK = [[1.0, 1.0, 0.0]]
ADV = [[2.0, 2.0, 0.0]]


def _run(tis: TisConfig, token_count: float = 2.0) -> tuple[LossOutput, torch.Tensor]:
    logp = torch.tensor(LOGP, requires_grad=True)
    loss_fn = ClippedPolicyLoss(clip_low=0.2, clip_high=0.28, tis=tis)
    out = loss_fn(logp, torch.tensor(ADV), _batch(MASK, OLD, ROLLOUT), token_count)
    out.loss.backward()
    assert logp.grad is not None
    return out, logp.grad


def test_tis_loss_metrics_and_gradient() -> None:
    out, grad = _run(TisConfig(mode="tis", clip=1.5))
    r1 = math.exp(0.5)
    w0 = min(math.exp(0.5), 1.5)                     # exp(old - rollout) = e^0.5 -> truncated at 1.5
    w1 = 1.0                                         # exp(0) = 1
    per_token = [-2.0 * 1.0 * w0, max(-2.0 * r1, -2.0 * 1.28) * w1]
    assert out.loss.item() == pytest.approx(sum(per_token) / 2, abs=1e-6)
    m = out.metrics
    assert m["pg_loss"] == pytest.approx(sum(per_token) / 2, abs=1e-6)
    assert m["ratio_mean"] == pytest.approx((1.0 + r1) / 2, abs=1e-6)
    assert m["clip_fraction"] == pytest.approx(0.5, abs=1e-6)
    assert m["tis_weight_mean"] == pytest.approx((w0 + w1) / 2, abs=1e-6)
    assert m["tis_clip_fraction"] == pytest.approx(0.5, abs=1e-6)
    assert m["logprob_abs_diff"] == pytest.approx((0.5 + 0.0) / 2, abs=1e-6)
    # d/dlogp of -A*ratio*w / N = -A*ratio*w / N on the unclipped token; 0 on the clipped and the masked one
    torch.testing.assert_close(grad, torch.tensor([[-2.0 * w0 / 2, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_global_token_count_scales_loss_and_metrics() -> None:
    local, _ = _run(TisConfig(mode="tis", clip=1.5), token_count=2.0)
    share, _ = _run(TisConfig(mode="tis", clip=1.5), token_count=8.0)
    assert share.loss.item() == pytest.approx(local.loss.item() / 4, abs=1e-6)
    assert share.metrics["ratio_mean"] == pytest.approx(local.metrics["ratio_mean"] / 4, abs=1e-6)


def test_icepop_zeroes_tokens_outside_the_band() -> None:
    out, grad = _run(TisConfig(mode="icepop", clip=1.5, low=0.5))
    r1 = math.exp(0.5)
    # token 0: exp(0.5) = 1.65 > 1.5 -> weight 0; token 1: ratio 1 in [0.5, 1.5] -> weight 1
    assert out.loss.item() == pytest.approx(max(-2.0 * r1, -2.0 * 1.28) / 2, abs=1e-6)
    assert out.metrics["tis_weight_mean"] == pytest.approx(0.5, abs=1e-6)
    assert out.metrics["tis_clip_fraction"] == pytest.approx(0.5, abs=1e-6)
    torch.testing.assert_close(grad, torch.zeros(1, 3), atol=1e-6, rtol=0)


def test_no_tis_weights_are_one() -> None:
    out, _ = _run(TisConfig(mode="none"))
    assert out.loss.item() == pytest.approx((-2.0 + -2.0 * 1.28) / 2, abs=1e-6)
    assert out.metrics["tis_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert out.metrics["tis_clip_fraction"] == 0.0


def test_negative_advantage_clips_below() -> None:
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)     # ratio 0.5 < 1 - 0.2
    out = ClippedPolicyLoss(0.2, 0.2, TisConfig(mode="none"))(logp, torch.tensor([[-1.0]]),
                                                                  _batch([[1.0]], [[0.0]], [[0.0]]), 1.0)
    assert out.loss.item() == pytest.approx(0.8, abs=1e-6)           # max(0.5, 0.8) * 1
    assert out.metrics["clip_fraction"] == pytest.approx(1.0)


def test_importance_weights_shapes() -> None:
    w, clipped = importance_weights(torch.zeros(2, 3), torch.full((2, 3), -1.0), TisConfig(mode="tis", clip=2.0))
    torch.testing.assert_close(w, torch.full((2, 3), 2.0))
    assert clipped.all()


def test_fully_masked_and_empty_batches_give_zero_loss_with_a_graph() -> None:
    loss_fn = ClippedPolicyLoss()
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = loss_fn(logp, torch.ones(1, 2), _batch([[0.0, 0.0]], [[-3.0, 0.0]], [[0.0, -9.0]]), 0.0)
    assert out.loss.item() == 0.0 and all(v == empty_value(k) for k, v in out.metrics.items())   # +-inf: min / max
    out.loss.backward()
    assert torch.equal(logp.grad, torch.zeros(1, 2))
    empty = torch.zeros(2, 0, requires_grad=True)
    out = loss_fn(empty, torch.zeros(2, 0), _batch([[], []], [[], []], [[], []]), 0.0)
    assert out.loss.item() == 0.0


def my_advantage(batch: TrainBatch) -> torch.Tensor:
    return torch.ones_like(batch.response_mask)


def my_loss(logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch, token_count: float) -> LossOutput:
    return LossOutput(loss=-(logprobs * advantages).sum() / token_count, metrics={})


def test_algorithm_preset_and_overrides() -> None:
    adv, loss = resolve(TrainerConfig())            # every loss comes wrapped in the entropy term (a metric)
    assert adv == grpo and isinstance(loss, EntropyTerm) and isinstance(loss.inner, ClippedPolicyLoss)
    cfg = TrainerConfig(clip_low=0.1, clip_high=0.3, tis=TisConfig(mode="icepop"))
    wrapped = resolve(cfg)[1]
    assert isinstance(wrapped, EntropyTerm) and wrapped.inner == ClippedPolicyLoss(0.1, 0.3, TisConfig(mode="icepop"))
    adv, loss = resolve(TrainerConfig(advantage="tests.unit.test_losses:my_advantage",
                                      loss="tests.unit.test_losses:my_loss"))
    assert adv is my_advantage and isinstance(loss, EntropyTerm) and loss.inner is my_loss


@pytest.mark.parametrize("field,value,match", [
    ("algorithm", "nope", "trainer.algorithm"),
    ("loss", "nope", "not a built-in"),
    ("advantage", "tests.unit.test_losses:missing", "no attribute"),
    ("loss", "tests.unit.test_losses:my_advantage", "positional"),
])
def test_bad_algorithm_names_are_clear(field: str, value: str, match: str) -> None:
    with pytest.raises(PluginError, match=match):
        resolve(TrainerConfig(**{field: value}))
