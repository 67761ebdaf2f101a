"""Rows whose advantage is zero at every token (a GRPO group whose samples all scored the same) skip the single-pass
forward: the loss, the gradients and the optimizer's step equal the whole batch's, the policy metrics are means over
the rows that trained, and configs whose loss a zero advantage does not silence keep every row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.config import TrainerConfig
from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.algorithms import resolve, skips_zero_advantage
from rlfleet.services.trainer.step import StepContext, train_step
from tests.support.grad_recorder import GradRecorder
from tests.support.tiny_model import make_tiny_model

TEMPERATURE = 0.9


def _groups(rewards: list[list[float]], seed: int) -> list[list[Sample]]:
    """One group per reward list; prompts and responses of different lengths, rollout logprobs a little off."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi, scores in enumerate(rewards):
        prompt = [1, *torch.randint(3, 19, (2 + gi % 3,), generator=g).tolist()]
        group = []
        for i, reward in enumerate(scores):
            t = 2 + (gi + i) % 4
            group.append(Sample(group_id=f"g{gi}", index=i, group_size=len(scores), prompt_ids=prompt,
                                response_ids=torch.randint(3, 19, (t,), generator=g).tolist(),
                                rollout_logprobs=(-2.5 - torch.rand(t, generator=g)).tolist(), loss_mask=[1] * t,
                                reward=reward))
        groups.append(group)
    return groups


class _Trainer:
    def __init__(self, model_dir: Path, skip: bool) -> None:
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():                            # peaked distributions: rows' entropies differ widely
            self.model.get_output_embeddings().weight.mul_(8.0)
        self.rows_seen: list[int] = []
        self.model.register_forward_hook(lambda _m, args, kwargs, _out: self.rows_seen.append(
            int(kwargs["input_ids"].shape[0] if "input_ids" in kwargs else args[0].shape[0])), with_kwargs=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.1)
        self.recorder = GradRecorder(self.model)
        cfg = TrainerConfig(tis={"mode": "tis", "clip": 1.2})
        advantage_fn, loss_fn = resolve(cfg)
        assert skips_zero_advantage(cfg, loss_fn)
        self.ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=[self.recorder],
                               temperature=TEMPERATURE, minibatches=1, grad_clip=1e9, world_size=1,
                               device=torch.device("cpu"), skip_zero_advantage=skip)

    def step(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        def clip(max_norm: float) -> float:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

        return train_step(self.model, self.optimizer, clip, groups, step, self.ctx)


def _entropy_mean(model: torch.nn.Module, samples: list[Sample]) -> float:
    """Mean entropy (at TEMPERATURE) of the distributions the response tokens were read from, one sample at a
    time: the reference for the metric over the rows that trained."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1] / TEMPERATURE     # [T, V]
            logp = torch.log_softmax(logits.double(), dim=-1)
            total += float(-(logp.exp() * logp).sum())
            count += logits.shape[0]
    return total / count


def test_zero_advantage_groups_skip_the_forward_with_the_same_loss_gradients_and_step(
        tmp_path: Path, gloo_world: None) -> None:
    model_dir = make_tiny_model(tmp_path / "m")
    rewards = [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]   # groups 0 and 2: advantage 0
    groups = _groups(rewards, seed=3)
    kept = [s for g in (groups[1], groups[3]) for s in g]
    skip, whole = _Trainer(model_dir, skip=True), _Trainer(model_dir, skip=False)
    want_entropy = _entropy_mean(skip.model, kept)
    whole_entropy = _entropy_mean(skip.model, [s for g in groups for s in g])
    skip.rows_seen.clear()
    m_skip, m_whole = skip.step(groups, 0), whole.step(groups, 0)

    assert skip.rows_seen == [6] and whole.rows_seen == [12]        # two of four groups ran the forward
    assert m_skip["zero_advantage_rows"] == pytest.approx(0.5)
    assert "zero_advantage_rows" not in m_whole
    for key in ("loss", "pg_loss", "samples", "tokens", "reward_mean"):
        assert m_skip[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-8), key
    assert m_skip["loss"] != 0.0
    assert m_skip["entropy"] == pytest.approx(want_entropy, rel=1e-5)
    assert m_whole["entropy"] == pytest.approx(whole_entropy, rel=1e-5)
    assert abs(whole_entropy - want_entropy) > 0.01 * want_entropy
    assert set(skip.recorder.grads) == set(whole.recorder.grads) and skip.recorder.grads
    for name, grad in whole.recorder.grads.items():
        torch.testing.assert_close(skip.recorder.grads[name], grad, rtol=1e-5, atol=1e-8, msg=name)
    for (name, p), q in zip(skip.model.named_parameters(), whole.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)


def test_an_all_zero_advantage_batch_steps_the_optimizer_as_the_whole_batch_does(
        tmp_path: Path, gloo_world: None) -> None:
    """With momentum from a first step, a batch where every group scored the same still moves the weights (AdamW's
    momentum and decay): the skip keeps one row so that every parameter gets its zero gradient."""
    model_dir = make_tiny_model(tmp_path / "m")
    skip, whole = _Trainer(model_dir, skip=True), _Trainer(model_dir, skip=False)
    first = _groups([[0.0, 1.0], [1.0, 0.0]], seed=5)
    flat = _groups([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]], seed=6)
    for t in (skip, whole):
        t.step(first, 0)
    before = [p.detach().clone() for p in whole.model.parameters()]
    m_skip, m_whole = skip.step(flat, 1), whole.step(flat, 1)
    assert skip.rows_seen == [4, 1] and whole.rows_seen == [4, 6]
    assert m_skip["zero_advantage_rows"] == 1.0
    assert m_skip["loss"] == m_whole["loss"] == 0.0
    moved = False
    for (name, p), q, b in zip(skip.model.named_parameters(), whole.model.parameters(), before, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-8, msg=name)
        moved = moved or not torch.equal(q, b)
    assert moved


@pytest.mark.parametrize("fields", [
    {},
    {"algorithm": "rloo"},
    {"algorithm": "dapo"},
    {"algorithm": "drgrpo"},
    {"algorithm": "reinforce_pp_baseline"},
])
def test_policy_gradient_losses_on_reward_only_advantages_skip(fields: dict) -> None:
    cfg = TrainerConfig(**fields)
    assert skips_zero_advantage(cfg, resolve(cfg)[1])


@pytest.mark.parametrize("fields", [
    {"kl": {"coef": 0.1}},                                   # the KL term is not zero at a zero advantage
    {"kl": {"coef": 0.1, "in_reward": True}},                # advantages read old and reference logprobs
    {"policy_loss": {"entropy_coef": 0.01}},                 # an entropy bonus is never zero
    {"tis": {"mode": "tis", "level": "sequence"}},           # sequence weights read whole rows
    {"algorithm": "gspo"},
    {"algorithm": "sft"},
    {"algorithm": "ppo"},
    {"algorithm": "distill", "teacher": {"model_path": "/nonexistent"}},
    {"advantage": "tests.unit.test_zero_advantage_rows:_plugin_advantage"},   # a plugin may read logprobs
])
def test_losses_or_advantages_a_zero_advantage_does_not_silence_keep_every_row(fields: dict) -> None:
    cfg = TrainerConfig(**fields)
    assert not skips_zero_advantage(cfg, resolve(cfg)[1])


def _plugin_advantage(batch: TrainBatch) -> torch.Tensor:
    return batch.rewards[:, None] * batch.response_mask
