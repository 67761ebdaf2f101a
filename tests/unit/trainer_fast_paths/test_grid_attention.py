"""The padding-free shared-prompt forward (services/trainer/fast_paths/grid_attention.py): a model switched to grid
attention is plain SDPA for every forward that carries no grid; the FSDP backend switches float32 SDPA models to it (and
only those), and a trained step through it equals the padded shared layout's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.config import parse_config
from rlfleet.sample import Sample
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.fast_paths.grid_attention import GRID_SDPA, Grid, use_grid_attention, uses_grid_attention
from rlfleet.services.trainer.fast_paths.shared_prompt import SharedPromptForward
from rlfleet.services.trainer.step import StepContext

torch.set_num_threads(1)


def test_without_a_grid_it_is_sdpa_bit_for_bit(tiny_model_dir: Path) -> None:
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    grid = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    assert use_grid_attention(grid) and grid.config._attn_implementation == GRID_SDPA
    ids = torch.tensor([[1, 5, 6, 14, 7, 9, 3], [0, 0, 1, 9, 4, 2, 8]])
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    want, got = plain(input_ids=ids, attention_mask=mask).logits, grid(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want)


def test_a_model_not_on_sdpa_is_left_alone(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert not use_grid_attention(model) and not uses_grid_attention(model)


def test_the_grid_maps_packed_tokens_to_their_cells_and_back() -> None:
    real = torch.tensor([[True, True, True, False], [True, True, False, False]])             # [R=2, L=4]
    grid = Grid.of(real)
    assert grid.cells.tolist() == [0, 1, 2, 4, 5]
    x = torch.arange(5, dtype=torch.float32).view(1, 1, 5, 1).repeat(1, 2, 1, 3)              # [1, H=2, T=5, 3]
    spread = grid.spread(x)                                                                   # [R, H, L, 3]
    assert spread.shape == (2, 2, 4, 3)
    assert spread[:, 0, :, 0].tolist() == [[0, 1, 2, 0], [3, 4, 0, 0]]   # padding cells read token 0
    back = grid.gather(spread.transpose(1, 2))                                                # [1, T, H, 3]
    assert torch.equal(back, x.transpose(1, 2))


def _groups() -> list[list[Sample]]:
    g = torch.Generator().manual_seed(3)
    groups = []
    for gi in range(2):
        prompt = [1, *torch.randint(3, 19, (2 + gi,), generator=g).tolist()]
        group = []
        for i in range(4):
            t = 1 + (gi + 3 * i) % 5
            group.append(Sample(group_id=f"g{gi}", index=i, group_size=4, prompt_ids=prompt,
                                response_ids=torch.randint(3, 19, (t,), generator=g).tolist(),
                                rollout_logprobs=[-2.0] * t, reward=float(i % 2)))
        groups.append(group)
    return groups


def _backend_step(model_dir: Path, unpadded: bool, precision: str = "fp32") -> tuple[FsdpBackend, dict[str, float],
                                                                                     dict[str, torch.Tensor]]:
    cfg = parse_config({"model": {"path": str(model_dir)},
                        "trainer": {"world_size": 1, "groups_per_step": 2, "precision": precision, "lr": 1e-3},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 4},
                        "perf": {"shared_prompt_unpadded": unpadded}})
    torch.manual_seed(0)
    backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
    advantage_fn, loss_fn = resolve(cfg.trainer)
    ctx = StepContext(advantage_fn, loss_fn, (), temperature=1.0, minibatches=1, grad_clip=1e9, world_size=1,
                      device=torch.device("cpu"), pad_id=backend.pad_id)
    metrics = backend.train_step(_groups(), 0, ctx)
    weights = {n: p.detach().full_tensor().clone() for n, p in backend.model.named_parameters()}
    return backend, metrics, weights


def test_the_backend_trains_through_the_grid_as_through_the_padded_layout(tiny_model_dir: Path) -> None:
    init_distributed("", 0, 1, torch.device("cpu"))
    try:
        grid, m_grid, w_grid = _backend_step(tiny_model_dir, unpadded=True)
        padded, m_padded, w_padded = _backend_step(tiny_model_dir, unpadded=False)
        assert uses_grid_attention(grid.model) and not uses_grid_attention(padded.model)
        assert isinstance(grid.forward, SharedPromptForward)
        assert grid.forward.shared_batches == 1                                    # laid out shared, through the grid
        for key, value in m_padded.items():
            assert m_grid[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        for name, want in w_padded.items():                                        # after one AdamW step
            torch.testing.assert_close(w_grid[name], want, atol=1e-6, rtol=1e-5, msg=name)
        bf16, _, _ = _backend_step(tiny_model_dir, unpadded=True, precision="bf16")
        assert not uses_grid_attention(bf16.model)                    # bf16 on CPU keeps its float32 attention
    finally:
        leave_distributed()



class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no logits_to_keep (the head runs on every position) but passes the rest on."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                use_cache: bool, **kwargs: object) -> object:
        return self.inner(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          use_cache=use_cache, **kwargs)


def test_a_model_without_logits_to_keep_reads_every_position(tiny_model_dir: Path) -> None:
    from rlfleet.services.trainer.batch import build_train_batch
    from rlfleet.services.trainer.fast_paths.shared_prompt import plan, shared_forward_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    assert use_grid_attention(model)
    batch = build_train_batch([s for g in _groups() for s in g])
    rows = plan(batch, 64)
    assert rows is not None
    with torch.no_grad():
        want = shared_forward_logprobs(model, batch, 1.0, rows, 0, torch.float32)              # head on kept rows
        got = shared_forward_logprobs(_NoLogitsToKeep(model), batch, 1.0, rows, 0, torch.float32)
    valid = batch.response_mask > 0
    torch.testing.assert_close(got[valid], want[valid], atol=1e-6, rtol=0)
