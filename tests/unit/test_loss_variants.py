"""verl's other policy losses (CISPO, GPG, Clip-Cov, KL-Cov) and the min / max metrics, each against its published
formula written out here in plain Python / torch (verl core_algos compute_policy_loss_{cispo,gpg,clip_cov,kl_cov};
TRL's clip_ratio/low_min, high_max and importance_sampling_ratio/min, max), loss and gradient, plus the rule that
combines a min / max metric over ranks and minibatches."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.loss_variants import ClipCovLoss, KlCovLoss
from rlfleet.services.trainer.losses import ClippedPolicyLoss
from rlfleet.services.trainer.metric_reduce import finite_extremes, reduce_over_ranks
from rlfleet.services.trainer.step_totals import add_minibatch
from tests.support.train_batches import train_batch

LOGP = [[-1.0, -2.0, -0.5, -0.3], [-0.2, -3.0, -1.0, -2.0], [-1.5, -1.1, -0.9, -1.0]]
OLD = [[-1.4, -1.6, -0.6, -0.4], [-0.1, -2.7, -0.9, -2.0], [-1.2, -1.0, -1.6, -1.0]]
ROLL = [[-1.6, -1.3, -0.1, -0.5], [-0.6, -3.0, -2.0, -1.0], [-1.0, -1.9, -1.1, -1.0]]
ADV = [[1.2, 1.2, 1.2, 1.2], [-0.8, -0.8, -0.8, -0.8], [0.5, 0.5, 0.5, 0.5]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
CELLS = [(i, j) for i, row in enumerate(MASK) for j, k in enumerate(row) if k]
N = len(CELLS)
TIS = {"mode": "tis", "clip": 1.5}


def _ratio(i: int, j: int) -> float:
    return math.exp(LOGP[i][j] - OLD[i][j])


def _w(i: int, j: int) -> float:
    return min(math.exp(OLD[i][j] - ROLL[i][j]), 1.5)


def _run(cfg: TrainerConfig | None = None, loss_fn=None):
    if loss_fn is None:
        assert cfg is not None
        _, loss_fn = resolve(cfg)
    logp = torch.tensor(LOGP, requires_grad=True)
    out = loss_fn(logp, torch.tensor(ADV), train_batch(MASK, rollout=ROLL, old=OLD), float(N))
    out.loss.backward()
    return out, logp.grad


def test_cispo_keeps_the_gradient_of_clipped_tokens() -> None:
    out, grad = _run(TrainerConfig(algorithm="cispo", tis=TIS))
    loss = 0.0
    for i, j in CELLS:
        c = min(max(_ratio(i, j), 0.8), 1.2)
        loss += -c * ADV[i][j] * LOGP[i][j] * _w(i, j)
        assert grad[i, j].item() == pytest.approx(-c * ADV[i][j] * _w(i, j) / N, abs=1e-6), (i, j)
    assert out.loss.item() == pytest.approx(loss / N, abs=1e-6)
    clipped = sum(not 0.8 <= _ratio(i, j) <= 1.2 for i, j in CELLS)
    assert 0 < clipped < N and out.metrics["clip_fraction"] == pytest.approx(clipped / N, abs=1e-6)


def test_gpg_is_the_plain_policy_gradient() -> None:
    out, grad = _run(TrainerConfig(algorithm="gpg", loss="gpg", advantage="grpo", tis=TIS,
                                   policy_loss={"agg": "seq-mean-token-mean"}))
    rows = [[j for j, k in enumerate(row) if k] for row in MASK]
    loss = sum(sum(-ADV[i][j] * LOGP[i][j] * _w(i, j) for j in idx) / len(idx) for i, idx in enumerate(rows)) / 3
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    for i, j in CELLS:
        assert grad[i, j].item() == pytest.approx(-ADV[i][j] * _w(i, j) / len(rows[i]) / 3, abs=1e-6)


def _covariances() -> dict[tuple[int, int], float]:
    mean_a = sum(ADV[i][j] for i, j in CELLS) / N
    mean_lp = sum(LOGP[i][j] for i, j in CELLS) / N
    return {(i, j): (ADV[i][j] - mean_a) * (LOGP[i][j] - mean_lp) for i, j in CELLS}


def _clipped_token(i: int, j: int) -> tuple[float, bool]:
    r, a = _ratio(i, j), ADV[i][j]
    unclipped, clipped = -a * r, -a * min(max(r, 0.8), 1.2)
    return max(unclipped, clipped), clipped > unclipped


def test_clip_cov_cuts_the_gradient_of_the_covariance_band() -> None:
    cov = _covariances()
    lb, ub = 0.05, 0.5
    cut = {c for c, v in cov.items() if lb < v < ub and not _clipped_token(*c)[1]}
    assert 0 < len(cut) < N
    # ratio 1: every candidate is cut (verl draws max(1, int(ratio * tokens)) of them at random)
    out, grad = _run(loss_fn=ClipCovLoss(tis=TisConfig(mode="none"), ratio=1.0, lb=lb, ub=ub))
    loss = sum(_clipped_token(i, j)[0] for i, j in CELLS if (i, j) not in cut) / N
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    for c in CELLS:
        r, a = _ratio(*c), ADV[c[0]][c[1]]
        want = 0.0 if c in cut or _clipped_token(*c)[1] else -a * r / N
        assert grad[c].item() == pytest.approx(want, abs=1e-6), c
    assert out.metrics["clip_fraction"] == pytest.approx(len(cut) / N, abs=1e-6)
    # a small ratio cuts exactly one token, one of the candidates
    out, grad = _run(loss_fn=ClipCovLoss(tis=TisConfig(mode="none"), ratio=1e-4, lb=lb, ub=ub,
                                         generator=torch.Generator().manual_seed(3)))
    zeroed = {c for c in CELLS if grad[c].item() == 0.0 and not _clipped_token(*c)[1]}
    assert len(zeroed) == 1 and zeroed <= cut


def test_kl_cov_penalises_the_largest_covariances() -> None:
    cov = _covariances()
    k = max(1, int(N * 0.25))                                              # 10 tokens -> 2
    top = set(sorted(cov, key=lambda c: cov[c], reverse=True)[:k])
    out, grad = _run(loss_fn=KlCovLoss(tis=TisConfig(mode="none"), ratio=0.25, coef=0.7))
    loss = 0.0
    for c in CELLS:
        i, j = c
        lr = LOGP[i][j] - OLD[i][j]
        loss += -ADV[i][j] * math.exp(lr) + (0.7 * abs(lr) if c in top else 0.0)
        want = -ADV[i][j] * math.exp(lr) + (0.7 * math.copysign(1.0, lr) if c in top else 0.0)
        assert grad[c].item() == pytest.approx(want / N, abs=1e-6), c
    assert out.loss.item() == pytest.approx(loss / N, abs=1e-6)


def test_min_max_metrics_are_trl_s() -> None:
    out, _ = _run(loss_fn=ClippedPolicyLoss(0.2, 0.2, TisConfig(mode="tis", clip=1.5)))
    m = out.metrics
    low = [sum(_ratio(i, j) < 0.8 and ADV[i][j] < 0 for j in range(4) if MASK[i][j]) / sum(MASK[i]) for i in range(3)]
    high = [sum(_ratio(i, j) > 1.2 and ADV[i][j] > 0 for j in range(4) if MASK[i][j]) / sum(MASK[i])
            for i in range(3)]
    assert max(high) > 0
    assert m["clip_fraction_low_min"] == pytest.approx(min(low), abs=1e-6)
    assert m["clip_fraction_high_max"] == pytest.approx(max(high), abs=1e-6)
    assert m["tis_weight_min"] == pytest.approx(min(_w(i, j) for i, j in CELLS), abs=1e-6)
    assert m["tis_weight_max"] == pytest.approx(max(_w(i, j) for i, j in CELLS), abs=1e-6)


def test_extremes_combine_by_min_and_max_over_ranks_and_minibatches() -> None:
    ranks = [{"a_mean": 0.25, "w_min": 0.5, "w_max": 1.5}, {"a_mean": 0.5, "w_min": math.inf, "w_max": 2.5}]

    # what the collectives return: the elementwise sum / max of every rank's list (both ranks send their names sorted)
    def sum_ranks(vals):
        return [sum(r[k] for r in ranks) for k in sorted(k for k in ranks[0] if not k.endswith(("_min", "_max")))]

    def max_ranks(vals):
        keys = sorted(k for k in ranks[0] if k.endswith(("_min", "_max")))
        return [max(-r[k] if k.endswith("_min") else r[k] for r in ranks) for k in keys]

    got = reduce_over_ranks(ranks[0], sum_ranks, max_ranks)
    assert got == {"a_mean": 0.75, "w_min": 0.5, "w_max": 2.5}
    totals: dict[str, float] = {}
    add_minibatch(totals, {"a_mean": 0.5, "w_min": 0.5, "w_max": 2.0, "n_max": -math.inf}, 1.0, 2)
    add_minibatch(totals, {"a_mean": 1.0, "w_min": 0.25, "w_max": 1.0, "n_max": -math.inf}, 1.0, 2)
    finite_extremes(totals)
    assert totals == {"a_mean": 0.75, "w_min": 0.25, "w_max": 2.0, "n_max": 0.0, "grad_norm": 1.0}
