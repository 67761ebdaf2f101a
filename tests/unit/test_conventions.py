"""trainer.convention and its knobs against verl's and TRL's formulas, written out here in plain Python / torch from
their code (verl core_algos.agg_loss, dp_actor's kl / entropy terms, torch_functional.masked_whiten; TRL
GRPOTrainer._compute_loss and _generate_and_score_completions), never by calling the code under test: each knob on a
case where the conventions give different numbers, the preset table, and a field set in the config winning over
its convention."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TrainerConfig, explain
from rlfleet.protocols import LossOutput
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.entropy import ENTROPY
from rlfleet.services.trainer.losses import ROW_COUNT, SEQ_COUNT
from tests.support.train_batches import train_batch

LOGP = [[-1.0, -2.0, -0.5, -0.3], [-0.2, -3.0, -1.0, -2.0], [-1.5, -1.1, -0.9, -1.0], [-1.0, -1.0, -1.0, -1.0]]
OLD = [[-1.1, -1.6, -0.5, -0.4], [-0.1, -2.7, -0.9, -2.0], [-1.2, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]]
REF = [[-0.4, -2.9, -0.7, -0.1], [-0.9, -2.0, -0.2, -2.6], [-1.0, -1.8, -1.9, -1.0], [-1.0, -1.0, -1.0, -1.0]]
ENT = [[3.0, 0.5, 1.0, 0.0], [0.1, 3.0, 0.7, 1.2], [1.5, 0.2, 2.2, 0.0], [0.0, 0.0, 0.0, 0.0]]
ADV = [[1.2, 1.2, 1.2, 1.2], [-0.8, -0.8, -0.8, -0.8], [0.5, 0.5, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]]
MASK = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]]     # row 3: an empty response
ROWS = [[j for j, k in enumerate(row) if k] for row in MASK]
NO_TIS = {"mode": "none"}


def _run(cfg: TrainerConfig) -> tuple[LossOutput, torch.Tensor]:
    _, loss_fn = resolve(cfg)
    logp = torch.tensor(LOGP, requires_grad=True)
    batch = train_batch(MASK, old=OLD, ref=REF, extras={ENTROPY: torch.tensor(ENT), ROW_COUNT: 4.0, SEQ_COUNT: 3.0})
    out = loss_fn(logp, torch.tensor(ADV), batch, float(sum(map(len, ROWS))))
    out.loss.backward()
    assert logp.grad is not None
    return out, logp.grad


def _trl_grpo_with_kl(logp: torch.Tensor, beta: float) -> torch.Tensor:
    """TRL's loss_type grpo with beta: per_token_loss = -min(r A, clip(r) A) + beta * k3, then
    ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean() over every row."""
    mask = torch.tensor(MASK, dtype=torch.float32)
    ratio = torch.exp(logp - torch.tensor(OLD))
    adv = torch.tensor(ADV)
    pg = -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
    d = torch.tensor(REF) - logp
    per_token = pg + beta * (torch.exp(d) - d - 1)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def test_trl_grpo_kl_is_aggregated_like_the_policy_loss() -> None:
    cfg = TrainerConfig(convention="trl", policy_loss={"agg": "grpo"}, kl={"coef": 0.04}, tis=NO_TIS)
    out, grad = _run(cfg)
    logp = torch.tensor(LOGP, requires_grad=True)
    ref = _trl_grpo_with_kl(logp, 0.04)
    ref.backward()
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    torch.testing.assert_close(grad, logp.grad, atol=1e-6, rtol=0)
    # rlfleet's default (a token-mean KL) is another number on this batch: the knob is what makes them equal
    default, default_grad = _run(TrainerConfig(policy_loss={"agg": "grpo", "empty_rows": "include",
                                                            "clip_ratio_c": 0.0}, kl={"coef": 0.04}, tis=NO_TIS))
    assert abs(default.loss.item() - ref.item()) > 1e-3
    assert (default_grad - logp.grad).abs().max() > 1e-4


def test_verl_entropy_bonus_is_aggregated_like_the_policy_loss() -> None:
    # verl: policy_loss -= agg_loss(entropy, loss_agg_mode) * coeff; seq-mean-token-mean over rows with a token
    coef = 0.1
    base, _ = _run(TrainerConfig(convention="verl", policy_loss={"agg": "seq-mean-token-mean"}, tis=NO_TIS))
    out, _ = _run(TrainerConfig(convention="verl", policy_loss={"agg": "seq-mean-token-mean", "entropy_coef": coef},
                                tis=NO_TIS))
    verl_entropy = sum(sum(ENT[i][j] for j in idx) / len(idx) for i, idx in enumerate(ROWS) if idx) / 3
    assert out.loss.item() == pytest.approx(base.loss.item() - coef * verl_entropy, abs=1e-6)
    # TRL (and rlfleet): a global token mean of the entropy
    trl, _ = _run(TrainerConfig(convention="trl", policy_loss={"agg": "seq-mean-token-mean", "entropy_coef": coef},
                                tis=NO_TIS))
    trl_base, _ = _run(TrainerConfig(convention="trl", policy_loss={"agg": "seq-mean-token-mean"}, tis=NO_TIS))
    token_mean = sum(ENT[i][j] for i, idx in enumerate(ROWS) for j in idx) / sum(map(len, ROWS))
    assert trl.loss.item() == pytest.approx(trl_base.loss.item() - coef * token_mean, abs=1e-6)
    assert abs(verl_entropy - token_mean) > 1e-2
    assert out.metrics["entropy"] == pytest.approx(token_mean, abs=1e-6)      # the metric: a token mean always


def test_trl_logs_the_ratio_weighted_kl() -> None:
    def k3(i: int, j: int) -> float:
        d = REF[i][j] - LOGP[i][j]
        return math.exp(d) - d - 1

    cells = [(i, j) for i, idx in enumerate(ROWS) for j in idx]
    plain = sum(k3(i, j) for i, j in cells) / len(cells)
    weighted = sum(k3(i, j) * math.exp(LOGP[i][j] - OLD[i][j]) for i, j in cells) / len(cells)
    kl = {"coef": 0.04, "ratio_weighted": True}
    trl, _ = _run(TrainerConfig(convention="trl", kl=kl, tis=NO_TIS))
    verl, _ = _run(TrainerConfig(convention="verl", kl=kl, tis=NO_TIS))
    assert trl.metrics["kl"] == pytest.approx(weighted, abs=1e-6)
    assert verl.metrics["kl"] == pytest.approx(plain, abs=1e-6)
    assert abs(weighted - plain) > 1e-3


def _verl_whiten(x: list[float]) -> list[float]:
    """verl masked_whiten: (x - mean) * rsqrt(unbiased var + 1e-8)."""
    n = len(x)
    mean = sum(x) / n
    var = sum((v - mean) ** 2 for v in x) / n * n / (n - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in x]


@pytest.mark.parametrize("algorithm", ["reinforce_pp", "reinforce_pp_baseline"])
def test_verl_whitening_uses_bessel(algorithm: str) -> None:
    rewards, groups = [1.0, 0.0, 2.0, 0.5], [0, 0, 1, 1]
    mask = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]
    batch = lambda: train_batch(mask, rewards=rewards, groups=groups)                  # noqa: E731
    per_token = []      # gamma 1: the sequence score on every token; the baseline subtracts the group mean
    for i, row in enumerate(mask):
        score = rewards[i] - (sum(rewards[k] for k in range(4) if groups[k] == groups[i]) / 2
                              if algorithm == "reinforce_pp_baseline" else 0.0)
        per_token += [score] * sum(row)
    expected = _verl_whiten(per_token)
    for convention, want in (("verl", expected), ("rlfleet", None)):
        estimator, _ = resolve(TrainerConfig(algorithm=algorithm, convention=convention))
        adv = estimator(batch())
        got = [float(adv[i, j]) for i, row in enumerate(mask) for j, k in enumerate(row) if k]
        if want is not None:
            assert got == pytest.approx(want, abs=1e-6)
        else:           # the population std: sqrt(n / (n - 1)) apart from verl's
            assert got[0] / expected[0] == pytest.approx(math.sqrt(8 / 7), abs=1e-5)   # 8 tokens


def test_trl_std_epsilon() -> None:
    rewards = [1.0, 0.0, 1.0, 1.0]         # one group: mean 0.75, unbiased std 0.5
    batch = lambda: train_batch([[1, 1]] * 4, rewards=rewards, groups=[0, 0, 0, 0])    # noqa: E731
    for convention, eps in (("trl", 1e-4), ("verl", 1e-6)):
        estimator, _ = resolve(TrainerConfig(convention=convention))
        assert float(estimator(batch())[1, 0]) == pytest.approx(-0.75 / (0.5 + eps), abs=1e-7)


def test_a_one_sample_group_gets_its_reward_in_verl_and_0_in_trl() -> None:
    # TRL: (r - mean of its group of one) / (std 0 + 1e-4) = 0; verl: mean 0, std 1 for a group of one
    batch = lambda: train_batch([[1, 1]] * 3, rewards=[1.0, 0.0, 0.7], groups=[0, 0, 1])   # noqa: E731
    for convention, want in (("trl", 0.0), ("verl", 0.7)):
        estimator, _ = resolve(TrainerConfig(convention=convention))
        assert float(estimator(batch())[2, 0]) == pytest.approx(want, abs=1e-7)


def test_gspo_clip_fraction_counts_tokens_for_verl_and_sequences_for_trl() -> None:
    # a narrow clip range: the sequence ratios of rows 0 and 1 leave it (their A's sign decides), row 2's is inside
    cfg = {"algorithm": "gspo", "tis": NO_TIS, "gspo": {"clip": (0.01, 0.01)}}
    clipped_rows = []
    for i, idx in enumerate(ROWS):
        if not idx:
            continue
        s = math.exp(sum(LOGP[i][j] - OLD[i][j] for j in idx) / len(idx))
        a = ADV[i][0]
        clipped_rows.append(-a * min(max(s, 0.99), 1.01) > -a * s)
    assert clipped_rows.count(True) not in (0, 3)
    verl, _ = _run(TrainerConfig(convention="verl", **cfg))
    trl, _ = _run(TrainerConfig(convention="trl", **cfg))
    tokens = sum(len(idx) for idx, c in zip([r for r in ROWS if r], clipped_rows, strict=True) if c)
    assert verl.metrics["clip_fraction"] == pytest.approx(tokens / 9, abs=1e-6)
    assert trl.metrics["clip_fraction"] == pytest.approx(clipped_rows.count(True) / 4, abs=1e-6)   # TRL: all rows


# the documented table (docs/algorithms.md), written out here
TABLE = {
    "kl.agg": ("token-mean", "policy", "policy"),
    "kl.logged": ("plain", "plain", "weighted"),
    "policy_loss.entropy_agg": ("token-mean", "policy", "token-mean"),
    "estimator.whiten_std": ("population", "bessel", "bessel"),
    "estimator.std_eps": (1e-6, 1e-6, 1e-4),
    "estimator.single_sample": ("reward", "reward", "zero"),
    "gspo.clip_fraction": ("sequence", "token", "sequence"),
    "policy_loss.empty_rows": ("exclude", "exclude", "include"),
    "policy_loss.clip_ratio_c": (3.0, 3.0, 0.0),
}


@pytest.mark.parametrize("column,convention", [(0, "rlfleet"), (1, "verl"), (2, "trl")])
def test_each_convention_sets_its_column_and_a_config_field_wins(column: int, convention: str) -> None:
    t = TrainerConfig.model_validate({"convention": convention})
    for dotted, values in TABLE.items():
        section, field = dotted.split(".")
        assert getattr(getattr(t, section), field) == values[column], dotted
    mine = TrainerConfig.model_validate({"convention": convention, "kl": {"agg": "token-mean", "coef": 0.1},
                                         "estimator": {"std_eps": 0.5}})
    assert mine.kl.agg == "token-mean" and mine.kl.coef == 0.1 and mine.estimator.std_eps == 0.5
    assert mine.kl.logged == TABLE["kl.logged"][column] and mine.estimator.whiten_std == \
        TABLE["estimator.whiten_std"][column]


def test_explain_names_each_convention_s_value() -> None:
    for dotted, values in TABLE.items():
        line = [x for x in explain(f"trainer.{dotted}").splitlines() if x.startswith("  trainer.convention:")]
        assert line == [f"  trainer.convention: rlfleet {values[0]}, verl {values[1]}, trl {values[2]}"], dotted
    assert not any("trainer.convention:" in x for x in explain("trainer.kl.coef").splitlines())
