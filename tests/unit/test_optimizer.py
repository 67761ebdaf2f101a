"""The trainer's AdamW (rlfleet/services/trainer/optimizer.py): fused where torch has the kernel, and either way the
AdamW update, checked against the update written out here from its definition (Loshchilov & Hutter, decoupled
weight decay) on plain tensors and on FSDP2-sharded (DTensor) parameters."""

from __future__ import annotations

import pytest
import torch

from rlfleet.services.trainer.optimizer import adamw

LR, BETAS, WD, EPS, STEPS = 1e-2, (0.9, 0.95), 0.05, 1e-8, 5


def reference_adamw(start: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Parameters after len(grads) AdamW steps, in float64: p -= lr*wd*p; m, v moments; bias-corrected step."""
    params = [p.double().clone() for p in start]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.double()
            params[i] *= 1 - LR * WD
            m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * g
            v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * g * g
            m_hat = m[i] / (1 - BETAS[0] ** t)
            v_hat = v[i] / (1 - BETAS[1] ** t)
            params[i] -= LR * m_hat / (v_hat.sqrt() + EPS)
    return params


def _grads(shapes: list[tuple[int, ...]]) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [[torch.randn(s, generator=gen) for s in shapes] for _ in range(STEPS)]


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_matches_its_definition_fused_or_not(fused: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 2, 4)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    start = [p.detach().clone() for p in params]
    grads = _grads(shapes)
    opt = adamw([*params, frozen], lr=LR, betas=BETAS, weight_decay=WD, fused=fused)
    assert opt.defaults["fused"] is (True if fused else None)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(params)       # the frozen one is left out
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    for got, want in zip(params, reference_adamw(start, grads), strict=True):
        assert torch.allclose(got.detach().double(), want, atol=2e-6, rtol=0), (got - want).abs().max()


def test_parameters_without_a_fused_kernel_take_the_loop() -> None:
    on_meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    assert adamw([on_meta], lr=LR, betas=BETAS).defaults["fused"] is None


@pytest.mark.usefixtures("gloo_world")
def test_fused_adamw_on_fsdp2_sharded_parameters_equals_the_definition() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    start = [p.detach().clone() for p in model.parameters()]
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = adamw(model.parameters(), lr=LR, betas=BETAS, weight_decay=WD)
    assert opt.defaults["fused"] is True
    grads = _grads([tuple(p.shape) for p in start])
    for step_grads in grads:
        for p, g in zip(model.parameters(), step_grads, strict=True):
            p.grad = torch.distributed.tensor.distribute_tensor(g, mesh, p.placements)
        opt.step()
    for got, want in zip(model.parameters(), reference_adamw(start, grads), strict=True):
        full = got.full_tensor().detach().double()
        assert torch.allclose(full, want, atol=2e-6, rtol=0), (full - want).abs().max()
