"""Issue 13's losses against hand-written references (plain Python math, never the code under test): dual-clip and
its metrics, the clamps, every loss_agg mode and alias under both empty-row conventions, the entropy metric and
bonus, the KL variants (abs, low_var_kl, straight-through "+", ratio-weighted, in the reward) and rollout correction
at sequence / geometric level, truncated or masked. Edge cases: an empty response, a token with ratio > c and a
negative advantage, extreme log-ratios (no NaN / inf)."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import KlConfig, TisConfig, TrainerConfig
from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.advantages import TOKEN_REWARDS
from rlfleet.services.trainer.algorithms import KlInReward, resolve
from rlfleet.services.trainer.batch import response_logprobs
from rlfleet.services.trainer.entropy import ENTROPY, ENTROPY_GRAD, entropy_from_logprobs
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
from tests.support.train_batches import train_batch

# row 0: ratio 5 with A < 0 (dual-clip bites), ratio 2 with A < 0, ratio 0.5; row 1: A > 0 with ratios 5 and 0.7;
# row 2: an empty response (fully masked); row 3: one valid token
LOGP = [[math.log(5) - 1, math.log(2) - 1, math.log(0.5) - 1], [math.log(5) - 2, math.log(0.7) - 2, -1.0],
        [-1.0, -1.0, -1.0], [-0.3, -9.0, -9.0]]
OLD = [[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], [-1.0, -1.0, -1.0], [-0.5, -1.0, -1.0]]
ROLL = [[-1.2, -0.8, -1.0], [-2.5, -2.0, -1.0], [-1.0, -1.0, -1.0], [-0.3, -1.0, -1.0]]
REF = [[-1.5, -1.1, -2.0], [-1.0, -2.5, -1.0], [-1.0, -1.0, -1.0], [-0.1, -1.0, -1.0]]
ADV = [[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0], [0.5, 0.5, 0.5], [0.8, 0.8, 0.8]]
MASK = [[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]]
NONE = TisConfig(mode="none")


def _cells(mask: list[list[int]] = MASK):
    return [(i, j) for i, row in enumerate(mask) for j, k in enumerate(row) if k]


def _batch(logp_old=OLD, **extras) -> TrainBatch:
    return train_batch(MASK, rollout=ROLL, old=logp_old, ref=REF, extras=dict(extras))


def _run(loss_fn, logp=LOGP, adv=ADV, token_count: float | None = None, **extras):
    x = torch.tensor(logp, requires_grad=True)
    count = float(len(_cells())) if token_count is None else token_count
    out = loss_fn(x, torch.tensor(adv), _batch(**extras), count)
    out.loss.backward()
    return out, x.grad


def _ref_token(i: int, j: int, low: float = 0.2, high: float = 0.2, c: float = 3.0) -> tuple[float, float]:
    """(per-token clipped loss, its d/dlogp) by hand: max(-A r, -A clip(r)), then min(., -A c) where A < 0."""
    r = math.exp(LOGP[i][j] - OLD[i][j])
    a = ADV[i][j]
    unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
    loss, grad = (unclipped, -a * r) if unclipped >= clipped else (clipped, 0.0)
    if c > 0 and a < 0 and loss > -a * c:
        loss, grad = -a * c, 0.0
    return loss, grad


@pytest.mark.parametrize("c", [3.0, 0.0])
def test_dual_clip_caps_a_runaway_negative_advantage_token(c: float) -> None:
    out, grad = _run(ClippedPolicyLoss(0.2, 0.2, NONE, clip_ratio_c=c))
    n = len(_cells())
    assert out.loss.item() == pytest.approx(sum(_ref_token(i, j, c=c)[0] for i, j in _cells()) / n, abs=1e-6)
    for i, j in _cells():
        assert grad[i, j].item() == pytest.approx(_ref_token(i, j, c=c)[1] / n, abs=1e-6), (i, j)
    # token (0, 0): ratio 5 > c, A = -1 -> loss exactly -A*c = 3 with no gradient; without dual-clip 5 and 5/n
    assert grad[0, 0].item() == (0.0 if c else pytest.approx(5.0 / n, abs=1e-6))
    m = out.metrics
    assert m["dual_clip_fraction"] == pytest.approx((1 / n) if c else 0.0)
    ratios = {(i, j): math.exp(LOGP[i][j] - OLD[i][j]) for i, j in _cells()}
    low = sum(1 for (i, j), r in ratios.items() if r < 0.8 and ADV[i][j] < 0) / n
    high = sum(1 for (i, j), r in ratios.items() if r > 1.2 and ADV[i][j] > 0) / n
    assert m["clip_fraction_low"] == pytest.approx(low) and m["clip_fraction_high"] == pytest.approx(high)
    assert low > 0 and high > 0
    assert m["ppo_kl"] == pytest.approx(sum(OLD[i][j] - LOGP[i][j] for i, j in _cells()) / n, abs=1e-6)
    assert grad[2].abs().max() == 0                                              # the empty response


def test_extreme_log_ratios_give_finite_losses_and_gradients() -> None:
    logp = [row[:] for row in LOGP]
    logp[0][1], logp[1][0], logp[3][0] = 100.0, 100.0, -100.0                   # log-ratios +101, +102, -99.5
    extreme = ((0, 1), (1, 0), (3, 0))
    n = len(_cells())
    for c in (3.0, 0.0):
        out, grad = _run(ClippedPolicyLoss(0.2, 0.28, NONE, clip_ratio_c=c), logp=logp)
        assert math.isfinite(out.loss.item()) and torch.isfinite(grad).all()
        assert all(math.isfinite(v) for v in out.metrics.values())
        # log-ratios clamped to +-20: (0, 1) A = -1 -> min(e^20, c) (c = 0: e^20); (1, 0) A = 2 -> -2 * 1.28;
        # (3, 0) A = 0.8, r = e^-20 -> -0.8 e^-20; all three outside the clamp, so no gradient
        rest = sum(_ref_token(i, j, 0.2, 0.28, c)[0] for i, j in _cells() if (i, j) not in extreme)
        expected = rest + (3.0 if c else math.exp(20.0)) - 2.0 * 1.28 - 0.8 * math.exp(-20.0)
        assert out.loss.item() == pytest.approx(expected / n, rel=1e-6)
        assert all(grad[i, j] == 0 for i, j in extreme)
    # k3 from ref - logp = +-100: clamped at 20 then at 10 -- never inf
    k3 = kl_estimate(torch.tensor([-101.0, 99.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0]), "k3")
    assert k3.tolist() == pytest.approx([10.0, 10.0, 0.0]) and torch.isfinite(k3).all()
    assert kl_estimate(torch.tensor([-1.0]), torch.tensor([-1.5]), "k3").item() == pytest.approx(
        math.exp(-0.5) - 1 + 0.5, abs=1e-7)


def _per_token(c: float = 3.0) -> dict[tuple[int, int], float]:
    return {(i, j): _ref_token(i, j, c=c)[0] for i, j in _cells()}


@pytest.mark.parametrize("mode,alias", [("token-mean", "bnpo"), ("token-mean", "dapo"), ("token-sum", None),
                                        ("seq-mean-token-sum", None), ("seq-mean-token-mean", "grpo"),
                                        ("seq-mean-token-sum-norm", "dr_grpo")])
@pytest.mark.parametrize("empty_rows", ["exclude", "include"])
def test_every_aggregation_mode_by_hand(mode: str, alias: str | None, empty_rows: str) -> None:
    per = _per_token()
    tokens, rows, valid_rows = 40.0, 12.0, 9.0                       # global counts of a 3-rank batch
    seqs = valid_rows if empty_rows == "exclude" else rows
    by_row = {i: [per[i, j] for j in range(3) if (i, j) in per] for i in range(4)}
    ref = {
        "token-mean": sum(per.values()) / tokens,
        "token-sum": sum(per.values()),
        "seq-mean-token-sum": sum(sum(v) for v in by_row.values()) / seqs,
        "seq-mean-token-mean": sum(sum(v) / len(v) for v in by_row.values() if v) / seqs,
        "seq-mean-token-sum-norm": sum(per.values()) / (seqs * 7),
    }[mode]
    for name in filter(None, (mode, alias)):
        loss = ClippedPolicyLoss(0.2, 0.2, NONE, agg=name, max_tokens=7, empty_rows=empty_rows)
        out, grad = _run(loss, token_count=tokens, **{ROW_COUNT: rows, SEQ_COUNT: valid_rows})
        assert out.loss.item() == pytest.approx(ref, abs=1e-6), name
        assert grad[2].abs().max() == 0
    resolved = resolve(TrainerConfig(policy_loss={"agg": alias or mode, "empty_rows": empty_rows})).__getitem__(1)
    assert isinstance(resolved, EntropyTerm) and isinstance(resolved.inner, ClippedPolicyLoss)
    assert resolved.inner.agg == mode


def test_unknown_aggregation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="trainer.policy_loss.agg"):
        ClippedPolicyLoss(agg="seq-max")
    with pytest.raises(ValueError, match="trainer.policy_loss.agg"):
        GspoLoss(agg="seq-max")


def test_entropy_from_the_logits_and_the_bonus() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, generator=g, requires_grad=True)                # [S, L, V]
    batch = TrainBatch(input_ids=torch.tensor([[1, 2, 3, 4], [2, 3, 4, 0]]),
                       attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
                       response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]), response_start=torch.tensor([2, 2]),
                       rollout_logprobs=torch.zeros(2, 2), rewards=torch.zeros(2),
                       group_index=torch.zeros(2, dtype=torch.int64), weight_versions=torch.zeros(2, dtype=torch.int64),
                       sample_ids=["a", "b"], extras={ENTROPY_GRAD: True})
    logp = response_logprobs(logits, batch, temperature=0.5)
    ent = batch.extras[ENTROPY]
    for s in range(2):
        for t in range(2):
            z = [float(v) / 0.5 for v in logits.detach()[s, 1 + t]]                      # position start+t-1 predicts t
            mx = max(z)
            lse = mx + math.log(sum(math.exp(v - mx) for v in z))
            p = [math.exp(v - lse) for v in z]
            assert ent[s, t].item() == pytest.approx(-sum(pi * (v - lse) for pi, v in zip(p, z, strict=True)),
                                                     abs=1e-5)
    out = EntropyTerm(SftLoss(), coef=0.1)(logp, torch.zeros(2, 2), batch, 3.0)
    mean = (ent[0, 0] + ent[0, 1] + ent[1, 0]).item() / 3
    assert out.metrics["entropy"] == pytest.approx(mean, abs=1e-6)
    nll = -(logp[0, 0] + logp[0, 1] + logp[1, 0]).item() / 3
    assert out.loss.item() == pytest.approx(nll - 0.1 * mean, abs=1e-6)
    out.loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    # without the flag: a metric only, no graph
    batch.extras[ENTROPY_GRAD] = False
    response_logprobs(logits, batch, temperature=0.5)
    assert not batch.extras[ENTROPY].requires_grad
    assert entropy_from_logprobs(torch.log(torch.tensor([[0.5, 0.5, 0.0]]))).item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="entropy_coef"):
        EntropyTerm(SftLoss(), coef=0.1)(logp, torch.zeros(2, 2), _batch_without_entropy(), 3.0)


def _batch_without_entropy() -> TrainBatch:
    b = _batch()
    b.response_mask = b.response_mask[:2, :2]
    return b


@pytest.mark.parametrize("kind", ["abs", "low_var_kl", "kl", "mse", "k3+", "low_var_kl+", "abs+", "k1+"])
def test_kl_variants_values_and_straight_through_gradients(kind: str) -> None:
    base = kind.rstrip("+")

    def value(lp: float, rf: float) -> float:
        x = lp - rf
        if base in ("kl", "k1"):
            return x
        if base == "abs":
            return abs(x)
        if base == "mse":
            return 0.5 * x * x
        neg = min(max(-x, -20.0), 20.0)
        return min(max(math.exp(neg) - 1 - neg, -10.0), 10.0)

    def grad(lp: float, rf: float) -> float:                           # "+": the gradient of k2 = x
        x = lp - rf
        if kind.endswith("+") or base == "mse":
            return x
        return {"kl": 1.0, "abs": math.copysign(1.0, x), "low_var_kl": 1.0 - math.exp(-x)}[base]

    inner = SftLoss()
    out, g = _run(KlPenalizedLoss(inner, 0.5, kind))
    n = len(_cells())
    kl = sum(value(LOGP[i][j], REF[i][j]) for i, j in _cells()) / n
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-6)
    nll = -sum(LOGP[i][j] for i, j in _cells()) / n
    assert out.loss.item() == pytest.approx(nll + 0.5 * kl, abs=1e-5)
    for i, j in _cells():
        assert g[i, j].item() == pytest.approx((-1 + 0.5 * grad(LOGP[i][j], REF[i][j])) / n, abs=1e-5), (i, j)


def test_ratio_weighted_kl_trl_bias_correction() -> None:
    out, g = _run(KlPenalizedLoss(SftLoss(), 0.5, "k3", ratio_weighted=True))
    n = len(_cells())
    total, grads = 0.0, {}
    for i, j in _cells():
        x, r = LOGP[i][j] - REF[i][j], math.exp(LOGP[i][j] - OLD[i][j])
        k3 = math.exp(-x) - 1 + x
        total += k3 * r
        grads[i, j] = (-1 + 0.5 * ((1 - math.exp(-x)) * r + k3 * r)) / n          # d(k3 * r)/dlogp
    nll = -sum(LOGP[i][j] for i, j in _cells()) / n
    assert out.loss.item() == pytest.approx(nll + 0.5 * total / n, abs=1e-5)
    for (i, j), v in grads.items():
        assert g[i, j].item() == pytest.approx(v, abs=1e-5)


def test_kl_in_reward_moves_the_penalty_into_the_scores() -> None:
    cfg = TrainerConfig(kl=KlConfig(coef=0.2, estimator="k1", in_reward=True))
    adv_fn, loss = resolve(cfg)
    assert isinstance(adv_fn, KlInReward) and isinstance(loss, EntropyTerm)
    assert not isinstance(loss.inner, KlPenalizedLoss)
    b = _batch()
    b.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    b.group_index = torch.tensor([0, 0, 1, 1])
    adv = adv_fn(b)
    # per-token rewards: -0.2 * (old - ref) on valid tokens; GRPO on the summed score of each sample
    scores = [b.rewards[i].item() - 0.2 * sum(OLD[i][j] - REF[i][j] for j in range(3) if MASK[i][j])
              for i in range(4)]
    expected = []
    for i in range(4):
        g = [k for k in range(4) if [0, 0, 1, 1][k] == [0, 0, 1, 1][i]]
        mean = sum(scores[k] for k in g) / 2
        std = math.sqrt(sum((scores[k] - mean) ** 2 for k in g) / 1)
        expected.append((scores[i] - mean) / (std + 1e-6))
    for i, j in _cells():
        assert adv[i, j].item() == pytest.approx(expected[i], abs=1e-5)
    assert b.extras[TOKEN_REWARDS][2].abs().max() == 0


@pytest.mark.parametrize("level", ["sequence", "geometric"])
@pytest.mark.parametrize("mode", ["tis", "mask"])
def test_sequence_and_geometric_rollout_correction(level: str, mode: str) -> None:
    tis = TisConfig(mode=mode, clip=1.5, low=0.9, level=level)
    out, grad = _run(ClippedPolicyLoss(0.2, 0.2, tis, clip_ratio_c=0.0))
    n = len(_cells())
    weights, ratios = {}, []
    for i in range(4):
        js = [j for j in range(3) if MASK[i][j]]
        if not js:
            continue
        d = sum(OLD[i][j] - ROLL[i][j] for j in js)
        ratio = math.exp(d / len(js) if level == "geometric" else d)
        ratios.append(ratio)
        w = min(ratio, 1.5) if mode == "tis" else float(0.9 <= ratio <= 1.5)
        weights.update({(i, j): w for j in js})
    loss = sum(_ref_token(i, j, c=0.0)[0] * weights[i, j] for i, j in _cells()) / n
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    for i, j in _cells():
        assert grad[i, j].item() == pytest.approx(_ref_token(i, j, c=0.0)[1] * weights[i, j] / n, abs=1e-6)
    m = out.metrics
    assert m["tis_weight_mean"] == pytest.approx(sum(weights.values()) / n, abs=1e-6)
    assert m["tis_seq_ratio_mean"] == pytest.approx(sum(ratios) / 3, abs=1e-6)   # 3 non-empty sequences
    clipped = sum(1 for i, j in _cells() if (weights[i, j] < 1.0 if mode == "mask" else weights[i, j] == 1.5))
    assert m["tis_clip_fraction"] == pytest.approx(clipped / n)
    assert len(set(weights.values())) > 1                # the correction bites on this data
