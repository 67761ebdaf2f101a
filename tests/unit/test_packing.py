"""Sequence packing: packed logprobs equal unpacked ones (to 1e-5) with sdpa and eager attention; no attention
crosses samples; first-fit row planning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.sample import Sample
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.sequence_packing import block_causal_mask, pack, packed_forward_logprobs, plan_rows
from tests.support.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("pack") / "model")


def _samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, t) in enumerate([(1, 3), (2, 0), (3, 5), (1, 1), (2, 4), (3, 2)]):     # one empty response
        ids = torch.randint(3, 19, (p + t,), generator=g).tolist()
        out.append(Sample(group_id=f"g{i // 2}", index=i % 2, group_size=2, prompt_ids=ids[:p], response_ids=ids[p:],
                          rollout_logprobs=[0.0] * t, loss_mask=[1] * t, reward=0.0))
    return out


def test_plan_rows_first_fit() -> None:
    assert plan_rows([4, 2, 8, 2, 5], 10) == [[0, 1, 3], [2], [4]]
    assert plan_rows([12, 3], 10) == [[0], [1]]              # too long for a row: a row of its own
    assert plan_rows([], 10) == []


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("max_tokens", [8, 12, 64])
def test_packed_logprobs_equal_unpacked(model_dir: Path, attn: str, max_tokens: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attn)
    batch = build_train_batch(_samples())
    with torch.no_grad():
        padded = forward_logprobs(model, batch, 0.7)                                     # [S, T]
        packed = packed_forward_logprobs(model, batch, 0.7, max_tokens=max_tokens)      # [S, T]
    valid = batch.response_mask > 0
    assert valid.sum() > 0
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=0)
    p = pack(batch, max_tokens)
    assert p.input_ids.shape[0] < len(_samples()) or max_tokens < 10                     # it did pack
    # the gradient path is the same too
    logp = packed_forward_logprobs(model, batch, 0.7, max_tokens=max_tokens)
    (logp * batch.response_mask).sum().backward()
    assert all(q.grad is not None for q in model.parameters() if q.requires_grad)


def test_mask_is_block_diagonal_and_causal() -> None:
    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    allowed = block_causal_mask(seg, torch.float32)[0, 0] == 0
    expected = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0],
                             [0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    p = pack(build_train_batch(_samples()[:2]), 16)
    assert p.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1]        # positions restart per sample
