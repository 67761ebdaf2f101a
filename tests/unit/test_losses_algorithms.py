"""Every built-in loss against a hand-written reference (plain Python loops) to 1e-6: clipped PG (GRPO, DAPO's
clip-higher, Dr. GRPO's constant normaliser), GSPO, SFT, the KL penalty (k1, k2, k3), off-policy metrics and ESS;
edge cases: fully masked tokens, an empty response, an empty batch."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.losses import (
    ROW_COUNT,
    SEQ_COUNT,
    ClippedPolicyLoss,
    EntropyTerm,
    GspoLoss,
    KlPenalizedLoss,
    SftLoss,
    kl_estimate,
)
from rlfleet.services.trainer.metric_reduce import empty_value
from rlfleet.services.trainer.step_totals import effective_sample_size
from tests.support.train_batches import train_batch

LOGP = [[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0], [-1.5, -1.5, -1.5]]
OLD = [[-1.1, -1.6, -0.5], [-0.2, -3.3, -2.0], [-1.0, -1.0, -1.0]]
ROLL = [[-1.3, -1.6, -0.1], [-0.9, -3.0, -2.0], [-1.0, -1.0, -1.0]]
REF = [[-0.9, -2.2, -0.7], [-0.4, -2.0, -1.0], [-1.0, -1.0, -1.0]]
ADV = [[1.5, 1.5, 1.5], [-0.7, -0.7, -0.7], [0.0, 0.0, 0.0]]
MASK = [[1, 1, 0], [1, 1, 1], [0, 0, 0]]          # row 2: an empty response (fully masked)
TIS = TisConfig(mode="tis", clip=1.3)
GEO = TisConfig(mode="tis", clip=1.3, level="geometric")


def _batch(mask: list[list[int]] = MASK, /, **extras: float) -> TrainBatch:
    s = len(mask)
    t = len(mask[0]) if mask else 0
    cut = lambda rows: [r[:t] for r in rows][:s]  # noqa: E731
    return train_batch(mask, rollout=cut(ROLL), old=cut(OLD), ref=cut(REF), extras=dict(extras))


def _tis_w(old: float, roll: float, tis: TisConfig = TIS) -> float:
    return min(math.exp(old - roll), tis.clip)


def _cells(mask: list[list[int]] = MASK):
    for i, row in enumerate(mask):
        for j, k in enumerate(row):
            if k:
                yield i, j


def _ref_clipped(low: float, high: float, denom: float) -> float:
    total = 0.0
    for i, j in _cells():
        ratio = math.exp(LOGP[i][j] - OLD[i][j])
        a = ADV[i][j]
        total += max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high)) * _tis_w(OLD[i][j], ROLL[i][j])
    return total / denom


def _run(loss_fn: LossFn, token_count: float = 5.0, **extras: float) -> tuple[LossOutput, torch.Tensor]:
    logp = torch.tensor(LOGP, requires_grad=True)
    out = loss_fn(logp, torch.tensor(ADV), _batch(**extras), token_count)
    out.loss.backward()
    return out, logp.grad


@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28)])      # GRPO / PPO; DAPO's clip-higher
def test_clipped_pg_token_level(low: float, high: float) -> None:
    out, grad = _run(ClippedPolicyLoss(low, high, TIS))
    assert out.loss.item() == pytest.approx(_ref_clipped(low, high, 5.0), abs=1e-6)
    assert grad[2].abs().max() == 0                              # the fully masked row gets no gradient
    m = out.metrics
    cells = list(_cells())
    assert m["ratio_mean"] == pytest.approx(sum(math.exp(LOGP[i][j] - OLD[i][j]) for i, j in cells) / 5, abs=1e-6)
    w = [_tis_w(OLD[i][j], ROLL[i][j]) for i, j in cells]
    assert m["tis_weight_mean"] == pytest.approx(sum(w) / 5, abs=1e-6)
    assert m["tis_weight_sq_mean"] == pytest.approx(sum(x * x for x in w) / 5, abs=1e-6)
    assert m["is_ratio_mean"] == pytest.approx(sum(math.exp(OLD[i][j] - ROLL[i][j]) for i, j in cells) / 5, abs=1e-6)
    assert m["tis_clip_fraction"] == pytest.approx(sum(math.exp(OLD[i][j] - ROLL[i][j]) > 1.3 for i, j in cells) / 5)
    assert m["logprob_abs_diff"] == pytest.approx(sum(abs(OLD[i][j] - ROLL[i][j]) for i, j in cells) / 5, abs=1e-6)
    ess = effective_sample_size(m)
    assert ess is not None
    assert ess == pytest.approx((sum(w) / 5) ** 2 / (sum(x * x for x in w) / 5), abs=1e-6) and 0 < ess <= 1


def test_dapo_preset_uses_clip_higher() -> None:
    _, loss = resolve(TrainerConfig(algorithm="dapo", tis=TIS))
    assert isinstance(loss, EntropyTerm)
    loss = loss.inner                                          # inside the entropy term
    assert loss == ClippedPolicyLoss(0.2, 0.28, TIS)
    out, _ = _run(loss)
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.28, 5.0), abs=1e-6)


def test_drgrpo_divides_by_rows_times_max_tokens() -> None:
    # TRL's convention (empty rows counted): global rows * max_tokens
    out, _ = _run(ClippedPolicyLoss(0.2, 0.2, TIS, agg="seq_sum_norm", max_tokens=8, empty_rows="include"),
                  **{ROW_COUNT: 6.0, SEQ_COUNT: 4.0})
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.2, 6.0 * 8), abs=1e-6)
    out, _ = _run(ClippedPolicyLoss(0.2, 0.2, TIS, agg="seq_sum_norm", empty_rows="include"))   # local rows, T
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.2, 3.0 * 3), abs=1e-6)
    # the default rule: rows with at least one valid token (row 2 is empty)
    out, _ = _run(ClippedPolicyLoss(0.2, 0.2, TIS, agg="dr_grpo", max_tokens=8), **{ROW_COUNT: 6.0, SEQ_COUNT: 4.0})
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.2, 4.0 * 8), abs=1e-6)
    out, _ = _run(ClippedPolicyLoss(0.2, 0.2, TIS, agg="seq-mean-token-sum-norm"))
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.2, 2.0 * 3), abs=1e-6)


def _ref_gspo(low: float, high: float, seqs: float) -> float:
    total = 0.0
    for i, row in enumerate(MASK):
        idx = [j for j, k in enumerate(row) if k]
        if not idx:
            continue
        s = math.exp(sum(LOGP[i][j] - OLD[i][j] for j in idx) / len(idx))
        a = sum(ADV[i][j] for j in idx) / len(idx)
        w = min(math.exp(sum(OLD[i][j] - ROLL[i][j] for j in idx) / len(idx)), TIS.clip)
        total += max(-a * s, -a * min(max(s, 1 - low), 1 + high)) * w
    return total / seqs


def test_gspo_sequence_ratio_and_gradient() -> None:
    # geometric-mean TIS weights here; every tis.level against its own reference: tests/unit/test_gspo_tis.py
    out, grad = _run(GspoLoss(3e-4, 4e-4, GEO))
    assert out.loss.item() == pytest.approx(_ref_gspo(3e-4, 4e-4, 2.0), abs=1e-6)      # 2 non-empty sequences
    out, _ = _run(GspoLoss(3e-4, 4e-4, GEO), **{SEQ_COUNT: 4.0})
    assert out.loss.item() == pytest.approx(_ref_gspo(3e-4, 4e-4, 4.0), abs=1e-6)
    # a wide clip range: d loss / d logp[i, j] = -A_i * s_i * w_i / |y_i| / seqs, the same for every token of i
    out, grad = _run(GspoLoss(10.0, 10.0, GEO))
    assert out.loss.item() == pytest.approx(_ref_gspo(10.0, 10.0, 2.0), abs=1e-6)
    s0 = math.exp(((LOGP[0][0] - OLD[0][0]) + (LOGP[0][1] - OLD[0][1])) / 2)
    w0 = min(math.exp(((OLD[0][0] - ROLL[0][0]) + (OLD[0][1] - ROLL[0][1])) / 2), TIS.clip)
    expected = -1.5 * s0 * w0 / 2 / 2
    torch.testing.assert_close(grad[0], torch.tensor([expected, expected, 0.0]), atol=1e-6, rtol=0)
    assert grad[2].abs().max() == 0


def test_sft_is_token_mean_nll() -> None:
    out, grad = _run(SftLoss())
    assert out.loss.item() == pytest.approx(-sum(LOGP[i][j] for i, j in _cells()) / 5, abs=1e-6)
    assert grad[2].abs().max() == 0 and grad[0, 0].item() == pytest.approx(-1 / 5)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_penalty(kind: str) -> None:
    def ref_k(lp: float, rf: float) -> float:
        x = lp - rf
        return {"k1": x, "k2": 0.5 * x * x, "k3": math.exp(-x) - 1 + x}[kind]

    inner = ClippedPolicyLoss(0.2, 0.2, TIS)
    out, _ = _run(KlPenalizedLoss(inner, 0.1, kind))
    kl = sum(ref_k(LOGP[i][j], REF[i][j]) for i, j in _cells()) / 5
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-6)
    assert out.loss.item() == pytest.approx(_ref_clipped(0.2, 0.2, 5.0) + 0.1 * kl, abs=1e-6)
    assert kl_estimate(torch.zeros(2), torch.zeros(2), kind).abs().max() == 0
    _, loss = resolve(TrainerConfig(kl={"coef": 0.1, "estimator": kind}))
    assert isinstance(loss, EntropyTerm) and isinstance(loss.inner, KlPenalizedLoss) and loss.inner.estimator == kind


@pytest.mark.parametrize("loss_fn", [ClippedPolicyLoss(), GspoLoss(), SftLoss(),
                                     ClippedPolicyLoss(agg="seq_sum_norm"), KlPenalizedLoss(SftLoss(), 0.5)])
def test_fully_masked_and_empty_batches_give_zero_loss_with_a_graph(loss_fn) -> None:
    logp = torch.tensor(LOGP, requires_grad=True)
    mask = [[0, 0, 0]] * 3
    out = loss_fn(logp, torch.tensor(ADV), _batch(mask), 0.0)
    assert out.loss.item() == 0.0 and all(v == empty_value(k) for k, v in out.metrics.items())   # +-inf: min / max
    out.loss.backward()
    assert torch.equal(logp.grad, torch.zeros(3, 3))
    empty = torch.zeros(3, 0, requires_grad=True)
    out = loss_fn(empty, torch.zeros(3, 0), _batch([[], [], []]), 0.0)
    assert out.loss.item() == 0.0
