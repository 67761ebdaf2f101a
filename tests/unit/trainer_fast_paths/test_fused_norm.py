"""RMSNorm as one op in float32 training (services/trainer/fast_paths/fused_norm.py): the same values and gradients as
the formula computed in float64, HF's order kept for bf16, the model's names and parameters unchanged, and the FSDP
backend using it only where it should."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from rlfleet.config import parse_config
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.fast_paths.fused_norm import FusedRMSNorm, fuse_rms_norms

torch.set_num_threads(1)
EPS = 1e-6


def float64_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., D], w [D] in float64: x / sqrt(mean(x^2) + eps) * w."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w


def test_float32_values_and_gradients_match_the_formula_in_float64() -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 64, generator=g) * 3).requires_grad_()
    w = torch.nn.Parameter(torch.randn(64, generator=g))
    out = FusedRMSNorm(w, EPS)(x)
    up = torch.randn(3, 5, 64, generator=g)
    (out * up).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = float64_rms_norm(x64, w64)
    (ref * up.double()).sum().backward()
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-6)
    assert x.grad is not None and x64.grad is not None and w.grad is not None and w64.grad is not None
    assert torch.allclose(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


def test_bf16_keeps_hfs_order_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g).to(torch.bfloat16)
    w = torch.nn.Parameter(torch.randn(32, generator=g).to(torch.bfloat16))
    h = x.float()                                   # HF: normalise in float32, cast to bf16, then scale in bf16
    want = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(torch.bfloat16)
    assert torch.equal(FusedRMSNorm(w, EPS)(x), want)


def test_swapping_keeps_names_parameters_and_logits(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 6, 14, 7, 9, 3], [1, 9, 9, 4, 2, 8, 8]])
    with torch.no_grad():
        before = model(input_ids=ids).logits                                  # [2, 7, V]
    params = dict(model.named_parameters())
    keys = list(model.state_dict())

    class MyNorm(LlamaRMSNorm):                      # a subclass may compute something else: left alone
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return super().forward(hidden_states) * 2
    custom = MyNorm(model.config.hidden_size)
    model.add_module("extra_norm", custom)
    layers = model.config.num_hidden_layers
    assert fuse_rms_norms(model) == 2 * layers + 1                            # two a layer and the final one
    assert model.get_submodule("extra_norm") is custom
    del model.extra_norm
    assert isinstance(model.model.norm, FusedRMSNorm) and isinstance(model.model.layers[0].input_layernorm,
                                                                     FusedRMSNorm)
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())          # the very same Parameters
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.allclose(after, before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("precision", "fused", "expect"), [
    ("fp32", True, FusedRMSNorm), ("fp32", False, LlamaRMSNorm), ("bf16", True, LlamaRMSNorm)])
def test_the_backend_fuses_only_float32_compute_and_only_when_on(tiny_model_dir: Path, precision: str, fused: bool,
                                                                  expect: type) -> None:
    cfg = parse_config({"model": {"path": str(tiny_model_dir)},
                        "trainer": {"world_size": 1, "groups_per_step": 1, "precision": precision},
                        "perf": {"trainer_fused_norm": fused},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2}})
    init_distributed("", 0, 1, torch.device("cpu"))
    try:
        backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
        norms = [m for m in backend.model.modules() if isinstance(m, (FusedRMSNorm, LlamaRMSNorm))]
        assert norms and all(type(m) is expect for m in norms)
        ids = torch.tensor([[1, 5, 6, 14, 7, 9, 3]])
        backend.model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        assert all(p.grad is not None for p in backend.model.parameters())  # FSDP hooks reach the swapped norms
    finally:
        leave_distributed()
