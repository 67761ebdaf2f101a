"""Samples -> TrainBatch, rank slices of a buffer batch, and response-token logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.sample import Sample
from rlfleet.services.trainer.batch import (
    build_train_batch,
    forward_logprobs,
    group_samples,
    rank_groups,
    response_logprobs,
)
from rlfleet.v1 import buffer_pb2
from tests.support.tiny_model import make_tiny_model


def _sample(gid: str, index: int, prompt: list[int], response: list[int], mask: list[int] | None = None,
            reward: float = 0.0, version: int = 0) -> Sample:
    return Sample(group_id=gid, index=index, group_size=2, prompt_ids=prompt, response_ids=response,
                  rollout_logprobs=[-0.5 - i for i in range(len(response))], loss_mask=mask, reward=reward,
                  weight_version=version)


def test_build_train_batch_pads_and_masks() -> None:
    samples = [_sample("a", 0, [1, 4], [5, 6, 2], mask=[1, 0, 1], reward=1.0, version=3),
               _sample("a", 1, [1, 4, 7], [8], reward=0.5),
               _sample("b", 0, [1], [], reward=-1.0, version=2)]
    b = build_train_batch(samples, pad_id=0)
    assert torch.equal(b.input_ids, torch.tensor([[1, 4, 5, 6, 2], [1, 4, 7, 8, 0], [1, 0, 0, 0, 0]]))
    assert torch.equal(b.attention_mask, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]]))
    assert torch.equal(b.response_start, torch.tensor([2, 3, 1]))
    assert torch.equal(b.response_mask, torch.tensor([[1.0, 0, 1], [1, 0, 0], [0, 0, 0]]))
    assert torch.equal(b.rollout_logprobs, torch.tensor([[-0.5, -1.5, -2.5], [-0.5, 0, 0], [0, 0, 0]]))
    assert torch.equal(b.rewards, torch.tensor([1.0, 0.5, -1.0]))
    assert torch.equal(b.group_index, torch.tensor([0, 0, 1]))
    assert torch.equal(b.weight_versions, torch.tensor([3, 0, 2]))
    assert b.sample_ids == ["a/0", "a/1", "b/0"]


def test_batch_from_the_wire_decodes_to_the_hand_written_arrays() -> None:
    """Batch message -> rank_groups -> build_train_batch (the vectorised scatter), with a partial rollout's token
    versions, a loss mask given and one left out, an empty prompt and an empty response."""
    samples = [Sample(group_id="g0", index=0, group_size=2, prompt_ids=[7, 8], response_ids=[9, 10, 11],
                      rollout_logprobs=[-0.25, -0.5, -1.0], loss_mask=[1, 0, 1], weight_version=4,
                      token_versions=[3, 3, 4]),
               Sample(group_id="g0", index=1, group_size=2, prompt_ids=[], response_ids=[12, 13],
                      rollout_logprobs=[-2.0, -4.0], weight_version=4),
               Sample(group_id="g1", index=0, group_size=2, prompt_ids=[5, 6, 7, 8, 9], response_ids=[],
                      rollout_logprobs=[], weight_version=2),
               Sample(group_id="g1", index=1, group_size=2, prompt_ids=[1], response_ids=[2],
                      rollout_logprobs=[-0.125], loss_mask=[0], weight_version=2)]
    wire = buffer_pb2.Batch(step=0, samples=[s.to_proto() for s in samples], group_ids=["g0", "g1"], complete=True)
    decoded = buffer_pb2.Batch.FromString(wire.SerializeToString())
    b = build_train_batch([s for g in rank_groups(decoded, 0, 1) for s in g], pad_id=99)
    assert torch.equal(b.input_ids, torch.tensor([[7, 8, 9, 10, 11], [12, 13, 99, 99, 99], [5, 6, 7, 8, 9],
                                                  [1, 2, 99, 99, 99]]))
    assert torch.equal(b.attention_mask, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1],
                                                       [1, 1, 0, 0, 0]]))
    assert torch.equal(b.response_start, torch.tensor([2, 0, 5, 1]))
    assert torch.equal(b.response_mask, torch.tensor([[1.0, 0, 1], [0, 1, 0], [0, 0, 0], [0, 0, 0]]))
    assert torch.equal(b.rollout_logprobs, torch.tensor([[-0.25, -0.5, -1.0], [-2.0, -4.0, 0], [0, 0, 0],
                                                         [-0.125, 0, 0]]))
    assert torch.equal(b.extras["token_versions"], torch.tensor([[3, 3, 4], [4, 4, 4], [2, 2, 2], [2, 2, 2]]))
    assert torch.equal(b.group_index, torch.tensor([0, 0, 1, 1]))
    assert (b.input_ids.dtype, b.attention_mask.dtype, b.response_mask.dtype, b.rollout_logprobs.dtype) == (
        torch.int64, torch.int64, torch.float32, torch.float32)


def test_empty_prompt_masks_the_unpredictable_first_token() -> None:
    b = build_train_batch([_sample("a", 0, [], [3, 4])])
    assert torch.equal(b.response_mask, torch.tensor([[0.0, 1.0]]))


def test_rank_groups_slices_whole_groups_in_order() -> None:
    msgs = [_sample(g, i, [1], [5]).to_proto() for g in ("g2", "g0", "g1", "g3") for i in (1, 0)]
    batch = buffer_pb2.Batch(step=4, samples=msgs, group_ids=["g2", "g0", "g1", "g3"], complete=True)
    r0, r1 = rank_groups(batch, 0, 2), rank_groups(batch, 1, 2)
    assert [[s.sample_id for s in g] for g in r0] == [["g2/0", "g2/1"], ["g0/0", "g0/1"]]
    assert [[s.sample_id for s in g] for g in r1] == [["g1/0", "g1/1"], ["g3/0", "g3/1"]]
    with pytest.raises(ValueError, match="not divisible"):
        rank_groups(batch, 0, 3)
    # two minibatches: {g2, g0} then {g1, g3}; each rank takes its half of each
    assert [g[0].group_id for g in rank_groups(batch, 0, 2, minibatches=2)] == ["g2", "g1"]
    assert [g[0].group_id for g in rank_groups(batch, 1, 2, minibatches=2)] == ["g0", "g3"]
    assert [g[0].group_id for g in group_samples([s for g in r1 for s in g])] == ["g1", "g3"]


def test_response_logprobs_from_logits_with_temperature() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 5)                                # [S=1, L=4, V=5]
    b = build_train_batch([_sample("a", 0, [1, 2], [3, 4])])
    for temp in (0.0, 1.0, 0.7):
        got = response_logprobs(logits, b, temp)                 # [1, 2]
        scale = temp or 1.0
        ref = torch.log_softmax(logits / scale, dim=-1)
        expected = torch.tensor([[ref[0, 1, 3], ref[0, 2, 4]]])  # token at i is predicted by the logit at i - 1
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_model_logprobs_do_not_depend_on_padding(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(make_tiny_model(tmp_path / "m")), dtype=torch.float32).eval()
    long = _sample("a", 0, [1, 5, 6, 7], [8, 9, 10, 2])
    short = _sample("a", 1, [1, 5], [11])
    with torch.no_grad():
        both = forward_logprobs(model, build_train_batch([long, short]), 0.8)   # [2, 4]
        alone = forward_logprobs(model, build_train_batch([short]), 0.8)        # [1, 1]
    torch.testing.assert_close(both[1, :1], alone[0], atol=1e-5, rtol=0)
    assert both.shape == (2, 4) and torch.isfinite(both).all() and (both[0] < 0).all()


def test_select_rows_indexes_every_per_row_field_and_extra_and_trims_on_request() -> None:
    """The one row selection (trainer minibatches, Megatron microbatches): rows [2, 0] of a 3-row batch."""
    from rlfleet.protocols import TrainBatch
    from rlfleet.services.trainer.batch import select_rows

    def marker() -> None:
        return None

    batch = TrainBatch(
        input_ids=torch.tensor([[1, 2, 0, 0], [3, 4, 5, 6], [7, 0, 0, 0]]),
        attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]),
        response_mask=torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]),
        response_start=torch.tensor([1, 2, 0]),
        rollout_logprobs=torch.tensor([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]]),
        rewards=torch.tensor([0.1, 0.2, 0.3]), group_index=torch.tensor([0, 0, 1]),
        weight_versions=torch.tensor([4, 5, 6]), sample_ids=["a", "b", "c"],
        old_logprobs=torch.tensor([[-0.1, -0.2], [-0.3, -0.4], [-0.5, -0.6]]), values=None,
        extras={"routed_experts": torch.arange(3 * 4 * 1 * 2).reshape(3, 4, 1, 2),     # [S, L, layers, K]
                "returns": torch.tensor([[1.0], [2.0], [3.0]]),
                "token_versions": torch.tensor([[4, 4], [5, 5], [6, 6]]),
                "all_reduce_sum": marker, "scale": torch.tensor(2.0)},
    )
    rows = torch.tensor([2, 0])
    sub = select_rows(batch, rows)
    assert sub.input_ids.tolist() == [[7, 0, 0, 0], [1, 2, 0, 0]]
    assert sub.attention_mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert sub.response_mask.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    assert sub.response_start.tolist() == [0, 1] and sub.group_index.tolist() == [1, 0]
    assert sub.rollout_logprobs.tolist() == [[-5.0, -6.0], [-1.0, -2.0]]
    assert sub.rewards.tolist() == pytest.approx([0.3, 0.1]) and sub.weight_versions.tolist() == [6, 4]
    assert sub.sample_ids == ["c", "a"] and sub.values is None
    assert sub.old_logprobs is not None
    assert torch.equal(sub.old_logprobs, torch.tensor([[-0.5, -0.6], [-0.1, -0.2]]))
    assert sub.extras["routed_experts"].tolist() == [[[[16, 17]], [[18, 19]], [[20, 21]], [[22, 23]]],
                                                    [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]]
    assert sub.extras["returns"].tolist() == [[3.0], [1.0]]
    assert sub.extras["token_versions"].tolist() == [[6, 6], [4, 4]]
    assert sub.extras["all_reduce_sum"] is marker and float(sub.extras["scale"]) == 2.0     # not per-row: kept
    assert batch.sample_ids == ["a", "b", "c"]                                              # the batch is untouched
    trimmed = select_rows(batch, rows, trim=True)                # longest selected row is 2 tokens: cut to 2
    assert trimmed.input_ids.tolist() == [[7, 0], [1, 2]] and trimmed.attention_mask.tolist() == [[1, 0], [1, 1]]
    assert trimmed.response_mask.shape == (2, 2)
