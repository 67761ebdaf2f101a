"""One decoder layer's parameters laid out for the lean decode step: q, k and v projections as consecutive rows of
one [(H + 2·Hkv)·Dh, D] matrix, gate and up as rows of one [2·F, D] matrix, so a decode step runs two matmuls where
the HF modules run five.

No copy is kept: the modules' own weights (and biases) are rebound as row views of the fused tensors. So the HF
modules (prefill, `perf.engine_fast_decode: false`), `state_dict()`, weight digests and in-place weight updates
(`param.copy_`) all read and write the very memory the fused matmuls use, and a weight update needs no re-fusing.
A row slice of a row-major matrix is itself contiguous, so each module's weight stays an ordinary dense tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LayerParams:
    """Views of one Llama-family decoder layer's parameters. Shapes: D hidden, F intermediate, H/Hkv heads, Dh."""
    ln1: torch.Tensor                 # [D] input RMSNorm weight
    qkv: torch.Tensor                 # [(H + 2·Hkv)·Dh, D] rows: q, then k, then v
    qkv_bias: torch.Tensor | None     # [(H + 2·Hkv)·Dh] or None (Llama); Qwen2 has q/k/v biases
    o: torch.Tensor                   # [D, H·Dh]
    o_bias: torch.Tensor | None       # [D] or None
    ln2: torch.Tensor                 # [D] post-attention RMSNorm weight
    gate_up: torch.Tensor             # [2·F, D] rows: gate, then up
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor                # [D, F]
    down_bias: torch.Tensor | None


def _fuse_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the linears' weights (and biases) by rows and rebind each linear's parameters as views of the
    result. Returns (weight [sum N, K], bias [sum N] or None when no linear has one)."""
    weights = [m.weight for m in linears]
    fused = torch.cat([w.detach() for w in weights], dim=0)                     # [sum N, K]
    has_bias = any(m.bias is not None for m in linears)
    bias = torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(w.shape[0])
                      for m, w in zip(linears, weights, strict=True)]) if has_bias else None
    start = 0
    for m, w in zip(linears, weights, strict=True):
        rows = w.shape[0]
        m.weight = nn.Parameter(fused[start:start + rows], requires_grad=w.requires_grad)
        if m.bias is not None and bias is not None:
            m.bias = nn.Parameter(bias[start:start + rows], requires_grad=m.bias.requires_grad)
        start += rows
    return fused, bias


def shared_parameters(model: nn.Module) -> set[int]:
    """ids of parameters reachable under more than one name (tied): never rebound."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def fuse_layers(model: nn.Module) -> list[LayerParams]:
    """Fuse every decoder layer of a Llama-family model (see fast_decode.supports) in place; returns their views.
    Raises ValueError (before changing anything) when a projection's weight is tied to another parameter."""
    shared = shared_parameters(model)
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        if any(id(m.weight) in shared for m in (at.q_proj, at.k_proj, at.v_proj, mlp.gate_proj, mlp.up_proj)):
            raise ValueError("tied q/k/v or gate/up projections cannot be fused")
    out = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        qkv_mods, gu_mods = [at.q_proj, at.k_proj, at.v_proj], [mlp.gate_proj, mlp.up_proj]
        qkv, qkv_bias = _fuse_rows(qkv_mods)
        gate_up, gate_up_bias = _fuse_rows(gu_mods)
        out.append(LayerParams(ln1=layer.input_layernorm.weight, qkv=qkv, qkv_bias=qkv_bias, o=at.o_proj.weight,
                               o_bias=at.o_proj.bias, ln2=layer.post_attention_layernorm.weight, gate_up=gate_up,
                               gate_up_bias=gate_up_bias, down=mlp.down_proj.weight, down_bias=mlp.down_proj.bias))
    return out
