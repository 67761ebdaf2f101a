"""bf16 training on CPU keeps attention in float32 (services/trainer/fast_paths/cpu_attention.py): the attention a bf16
model computes, and its gradients, are float32 attention on the bf16 inputs; the FSDP backend switches a bf16 CPU model
to it and trains."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rlfleet.config import parse_config
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.fast_paths.cpu_attention import FP32_SDPA, use_fp32_attention

torch.set_num_threads(1)


def float32_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """torch's SDPA on float32 copies of bf16 q [B, H, L, D], k / v [B, H, L, D] -> [B, L, H, D] in bf16."""
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed, scale=scale)
    return out.transpose(1, 2).to(torch.bfloat16)


def test_attention_runs_in_float32_on_bf16_inputs_and_its_gradients_follow(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16, attn_implementation="sdpa")
    assert use_fp32_attention(model) and model.config._attn_implementation == FP32_SDPA
    from transformers import AttentionInterface

    attend = AttentionInterface()[FP32_SDPA]
    heads, scale = model.config.num_attention_heads, 8 ** -0.5
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(2, heads, 32, 8, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    allowed = torch.ones(32, 32, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)      # [B, 1, L, L]
    allowed[1, :, 1:, 0] = False                                # row 1: position 0 is seen by itself only
    out, _ = attend(model.model.layers[0].self_attn, *leaves, allowed, dropout=0.0, scaling=scale)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 32, heads, 8)
    out.float().pow(2).sum().backward()
    mine = [t.grad for t in leaves]
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref = float32_reference(ref_leaves[0], ref_leaves[1], ref_leaves[2], allowed, scale)
    ref.float().pow(2).sum().backward()
    assert torch.equal(out, ref)                                # float32 attention rounded once to bf16
    for got, want in zip(mine, (t.grad for t in ref_leaves), strict=True):
        assert got is not None and want is not None and got.dtype == torch.bfloat16 and torch.equal(got, want)
    # what it replaces differs: bf16 attention rounds inside the kernel (a check that the test can tell them apart)
    q, k, v = (t.detach() for t in leaves)
    bf16 = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    assert not torch.equal(bf16.transpose(1, 2), ref)


def test_a_model_not_on_sdpa_is_left_alone(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert not use_fp32_attention(model) and model.config._attn_implementation == "eager"


def test_the_backend_trains_bf16_on_cpu_with_float32_attention(tiny_model_dir: Path) -> None:
    cfg = parse_config({"model": {"path": str(tiny_model_dir)},
                        "trainer": {"world_size": 1, "groups_per_step": 1, "precision": "bf16"},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2}})
    init_distributed("", 0, 1, torch.device("cpu"))
    try:
        backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
        assert backend.compute_dtype == torch.bfloat16 and backend.model.config._attn_implementation == FP32_SDPA
        ids = torch.tensor([[1, 5, 6, 14, 7, 9, 3], [1, 9, 9, 4, 2, 8, 8]])
        logits = backend.model(input_ids=ids).logits                       # [2, 7, V] in bf16
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
        logits.float().logsumexp(-1).mean().backward()
        grads = [p.grad for p in backend.model.parameters()]
        assert all(gr is not None and torch.isfinite(gr.full_tensor()).all() for gr in grads)
    finally:
        leave_distributed()
