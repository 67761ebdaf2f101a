"""Shared-prompt forward: a group's prompt runs once, and logprobs, losses and gradients equal the padded forward's;
responses never see each other; sharing is used only where it saves tokens; a model that ignores custom masks is
detected on the first batch and run padded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rlfleet.config import TrainerConfig
from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.fast_paths.grid_attention import use_grid_attention
from rlfleet.services.trainer.fast_paths.shared_prompt import (
    SharedPromptForward,
    lay_out,
    plan,
    shared_forward_logprobs,
    shared_mask,
)
from rlfleet.services.trainer.step import StepContext, train_step
from tests.support.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("shared") / "model")


def _groups(sizes: tuple[int, ...] = (3, 2, 4), seed: int = 0) -> list[list[Sample]]:
    """Groups sharing a prompt each (prompt lengths 2..4), responses of 0..5 tokens (one empty)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi, k in enumerate(sizes):
        prompt = [1, *torch.randint(3, 19, (1 + gi % 3,), generator=g).tolist()]
        group = []
        for i in range(k):
            t = (gi + 2 * i) % 6 if (gi, i) != (1, 1) else 0
            resp = torch.randint(3, 19, (t,), generator=g).tolist()
            group.append(Sample(group_id=f"g{gi}", index=i, group_size=k, prompt_ids=prompt, response_ids=resp,
                                rollout_logprobs=(-2.0 - torch.rand(t, generator=g)).tolist(), loss_mask=[1] * t,
                                reward=float(torch.rand(1, generator=g))))
        groups.append(group)
    return groups


def _batch(groups: list[list[Sample]]) -> TrainBatch:
    return build_train_batch([s for grp in groups for s in grp])


def test_mask_lets_responses_see_the_prompt_and_themselves_only() -> None:
    seg = torch.tensor([[0, 0, 1, 1, 2, 2, -1]])       # prompt of 2, two responses of 2, one pad
    allowed = shared_mask(seg)[0, 0].int()
    expected = torch.tensor([[1, 0, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 1, 0, 0, 0],
                             [1, 1, 0, 0, 1, 0, 0],    # response 2 does not see response 1
                             [1, 1, 0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 0, 0, 1]], dtype=torch.int32)
    assert torch.equal(allowed, expected)


def test_layout_positions_restart_after_the_prompt() -> None:
    batch = _batch(_groups((3,)))
    rows = plan(batch, 64)
    assert rows == [[0, 1, 2]]
    layout = lay_out(batch, rows)
    p = int(batch.response_start[0])
    lens = (batch.attention_mask.sum(1) - batch.response_start).tolist()
    want = list(range(p)) + [q for n in lens for q in range(p, p + n)]
    assert layout.position_ids[0, :len(want)].tolist() == want
    assert layout.input_ids.shape[1] == p + sum(lens)         # the prompt once, then every response


def test_plan_shares_only_where_it_saves_tokens() -> None:
    batch = _batch(_groups((3, 2, 4)))
    rows = plan(batch, 64)
    assert rows == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    split = plan(batch, 8)                                   # rows of at most 8 tokens: families split
    assert split is not None and sorted(i for r in split for i in r) == list(range(9)) and len(split) > 3
    assert plan(_batch(_groups((1, 1, 1))), 64) is None     # every prompt unique: nothing to share
    empty = [[Sample(group_id="e", index=i, group_size=2, prompt_ids=[], response_ids=[5, 6],
                     rollout_logprobs=[0.0, 0.0]) for i in range(2)]]
    assert plan(_batch(empty), 64) is None                   # an empty prompt: nothing predicts the first token


def _gqa_model() -> torch.nn.Module:
    """A random llama whose keys and values have fewer heads than its queries (SmolLM2: 9 and 3)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


@pytest.mark.parametrize("attn", ["sdpa", "eager", "grid", "grid-gqa"])
@pytest.mark.parametrize("max_tokens", [8, 64])
def test_shared_logprobs_and_gradients_equal_padded(model_dir: Path, attn: str, max_tokens: int) -> None:
    """grid: the real tokens only, attention on the layout's grid (grid_attention.py); the padded forward of the same
    model is plain SDPA. grid-gqa: the same with grouped-query attention."""
    model = _gqa_model() if attn == "grid-gqa" else AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="sdpa" if attn == "grid" else attn)
    if attn.startswith("grid"):
        assert use_grid_attention(model)
    batch = _batch(_groups())
    rows = plan(batch, max_tokens)
    assert rows is not None
    padded = forward_logprobs(model, batch, 0.7)                                            # [S, T]
    (padded * batch.response_mask).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    shared = shared_forward_logprobs(model, batch, 0.7, rows, 0, torch.float32)           # [S, T]
    (shared * batch.response_mask).sum().backward()
    valid = batch.response_mask > 0
    torch.testing.assert_close(shared[valid], padded[valid], atol=1e-5, rtol=0)
    assert want and bool(torch.isfinite(shared).all())
    for name, grad in want.items():
        got = dict(model.named_parameters())[name].grad
        assert got is not None
        torch.testing.assert_close(got, grad, atol=1e-5, rtol=1e-4, msg=name)


class _IgnoresMasks(torch.nn.Module):
    """A causal LM that drops attention_mask and position_ids (as some custom models do)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids: torch.Tensor, **_: object) -> object:
        return self.inner(input_ids=input_ids, use_cache=False)


def _right_padded_forward(model: torch.nn.Module, batch: TrainBatch, temperature: float) -> torch.Tensor:
    return forward_logprobs(model, batch, temperature)


def test_a_model_that_ignores_the_mask_is_run_padded(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _IgnoresMasks(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32))
    batch = _batch(_groups())
    fwd = SharedPromptForward(_right_padded_forward, 64, 0, torch.float32)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        out = fwd(model, batch, 1.0)
        again = fwd(model, batch, 1.0)
    assert not fwd.enabled and fwd.shared_batches == 0
    assert "shared-prompt forward switched off" in caplog.text
    with torch.no_grad():
        assert torch.equal(out, forward_logprobs(model, batch, 1.0)) and torch.equal(again, out)


def _step(model_dir: Path, shared: bool) -> tuple[dict[str, float], dict[str, torch.Tensor], SharedPromptForward]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    advantage_fn, loss_fn = resolve(TrainerConfig(advantage="grpo", tis={"mode": "tis", "clip": 1.2}))
    fwd = SharedPromptForward(_right_padded_forward, 64, 0, torch.float32)
    ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=[], temperature=0.9, minibatches=1,
                      grad_clip=1e9, world_size=1, device=torch.device("cpu"), forward=fwd if shared else None)
    grads: dict[str, torch.Tensor] = {}

    def clip(max_norm: float) -> float:
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    return train_step(model, optimizer, clip, _groups(), 0, ctx), grads, fwd


def test_a_train_step_is_the_same_shared_or_padded(model_dir: Path, gloo_world: None) -> None:
    shared, g_shared, fwd = _step(model_dir, True)
    padded, g_padded, _ = _step(model_dir, False)
    assert fwd.enabled and fwd.shared_batches == 1             # checked once, then laid out shared
    assert set(shared) == set(padded)
    for key, value in padded.items():
        assert shared[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert set(g_shared) == set(g_padded) and g_padded
    for name, grad in g_padded.items():
        torch.testing.assert_close(g_shared[name], grad, atol=1e-6, rtol=1e-4, msg=name)
