"""One optimizer step per batch: old logprobs from the training forward (one pass) give the same losses, metrics
and gradients as the separate no-grad forward (two passes), with one forward instead of two."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.config import TrainerConfig
from rlfleet.protocols import LossOutput, TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.step import StepContext, train_step, uses_single_pass
from tests.support.grad_recorder import GradRecorder
from tests.support.tiny_model import make_tiny_model


def _groups(seed: int) -> list[list[Sample]]:
    """3 groups of 2 samples of different lengths; rollout logprobs off the model's by a little (TIS acts)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(3):
        group = []
        for i in range(2):
            p, t = 2 + (gi + i) % 3, 2 + (gi * 2 + i) % 4
            ids = torch.randint(3, 19, (p + t,), generator=g).tolist()
            group.append(Sample(group_id=f"g{gi}", index=i, group_size=2, prompt_ids=[1, *ids[:p]],
                                response_ids=ids[p:], rollout_logprobs=(-2.5 - torch.rand(t, generator=g)).tolist(),
                                loss_mask=[1] * t, reward=float(torch.rand(1, generator=g))))
        groups.append(group)
    return groups


class _NeedsOld:
    needs_old_logprobs = True


def _run(model_dir: Path, single_pass: bool, advantage: str) -> tuple[dict[str, float], GradRecorder, int]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    recorder = GradRecorder(model)
    cfg = TrainerConfig(advantage=advantage, tis={"mode": "tis", "clip": 1.2})
    advantage_fn, loss_fn = resolve(cfg)
    ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=[recorder], temperature=0.9, minibatches=1,
                      grad_clip=1e9, world_size=1, device=torch.device("cpu"), single_pass=single_pass)

    def clip(max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    metrics = train_step(model, optimizer, clip, _groups(7), 0, ctx)
    return metrics, recorder, calls[0]


@pytest.mark.parametrize("advantage", ["grpo", "reinforce_pp"])
def test_single_pass_equals_two_passes(tmp_path: Path, gloo_world: None, advantage: str) -> None:
    model_dir = make_tiny_model(tmp_path / "m")
    one, rec1, calls1 = _run(model_dir, True, advantage)
    two, rec2, calls2 = _run(model_dir, False, advantage)
    assert (calls1, calls2) == (1, 2)                 # the no-grad forward is gone
    assert rec1.old is not None and rec2.old is not None and torch.equal(rec1.old, rec2.old)
    assert set(one) == set(two)
    for key in two:
        assert one[key] == pytest.approx(two[key], rel=1e-6, abs=1e-7), key
    assert 0.0 < one["tis_clip_fraction"] < 1.0       # TIS truncated some tokens and not others
    assert set(rec1.grads) == set(rec2.grads) and rec1.grads
    for name, grad in rec2.grads.items():
        torch.testing.assert_close(rec1.grads[name], grad, rtol=1e-6, atol=1e-8, msg=name)


def _unused_loss(logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
    raise AssertionError("uses_single_pass never computes the loss")


def test_two_passes_when_the_batch_feeds_several_steps_or_a_hook_asks() -> None:
    ctx = StepContext(advantage_fn=lambda b: b.rewards, loss_fn=_unused_loss, hooks=[], temperature=1.0,
                      minibatches=1, grad_clip=1.0, world_size=1, device=torch.device("cpu"))
    assert uses_single_pass(ctx)
    assert not uses_single_pass(replace(ctx, minibatches=2))
    assert not uses_single_pass(replace(ctx, single_pass=False))
    assert not uses_single_pass(replace(ctx, hooks=[_NeedsOld()]))
