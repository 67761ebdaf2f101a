"""A packed prefill for Llama-family models, beside fast_decode's decode step: the same math as the HF forward, on
the prompts' real tokens only, writing keys and values straight into the decode step's slack-padded cache buffers.

The HF forward of a left-padded batch runs every matmul over U x P positions (P the longest prompt) and builds a
cache that the first decode step then copies into slack buffers, once more for a group's copies. Here the matmuls
run over the T = sum of the prompt lengths real tokens ([T, D] rows), only attention uses the padded [U, P] grid
(each prompt attends causally to its own tokens), and each layer's keys/values are scattered once into buffers
[N, Hkv, P + SLACK, Dh] that already hold the group copies (N rows: `rows` maps each to its prompt), so the first
decode step appends in place. Only the last token of each prompt goes through the final norm and the LM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet.cpu_kernels import fused_rms_norm as norm
from rlfleet.services.rollout.engines.lean_llama.fused_params import LayerParams
from rlfleet.services.rollout.engines.lean_llama.llama_ops import Linears


@dataclass(frozen=True)
class PackedPrompts:
    """Where each real token of U left-padded prompts sits. T tokens, prompts of lengths l_u, P = max l_u."""
    ids: torch.Tensor          # [T] token ids, prompt after prompt
    pos: torch.Tensor          # [T] position of each token in its prompt (0 .. l_u - 1)
    grid: torch.Tensor         # [T] index into the flattened left-padded grid [U * P]
    last: torch.Tensor         # [U] index in [T] of each prompt's last token
    mask: torch.Tensor         # [U, P] 1 where a real token sits (left padding 0)
    attn: torch.Tensor         # [U, 1, P, P] additive causal-and-padding mask (a padded query sees itself)


def pack(prompts: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device) -> PackedPrompts:
    lengths = torch.tensor([len(p) for p in prompts])                                   # [U]
    u, width = len(prompts), int(lengths.max())
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long)               # [T]
    starts = torch.cumsum(lengths, 0) - lengths                                          # [U]
    row = torch.repeat_interleave(torch.arange(u), lengths)                             # [T]
    pos = torch.arange(len(ids)) - starts[row]                                           # [T]
    grid = row * width + (width - lengths[row]) + pos                                    # [T]
    cols = torch.arange(width)
    mask = (cols.unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()                 # [U, P]
    causal = cols.unsqueeze(0) <= cols.unsqueeze(1)                                      # [P, P] key <= query
    allowed = (causal.unsqueeze(0) & mask.bool().unsqueeze(1)) | torch.eye(width, dtype=torch.bool)   # [U, P, P]
    attn = torch.zeros(u, 1, width, width, dtype=dtype).masked_fill_(~allowed.unsqueeze(1), float("-inf"))
    return PackedPrompts(ids=ids.to(device), pos=pos.to(device), grid=grid.to(device),
                         last=(starts + lengths - 1).to(device), mask=mask.to(device), attn=attn.to(device))


def prefill_layer(x: torch.Tensor, p: LayerParams, packed: PackedPrompts, cos: torch.Tensor, sin: torch.Tensor,
                  keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, heads: int, kv_heads: int,
                  head_dim: int, eps: float, ops: Linears) -> torch.Tensor:
    """One decoder layer over the packed tokens.

    x: [T, D]; cos, sin: [T, H+Hkv, Dh] (as fast_decode's rotary gives them: q's heads carry the attention scale);
    keys, values: [N, Hkv, C, Dh] buffers (C >= P) whose first P columns receive this layer's cache, row n holding
    prompt rows[n]. Returns x [T, D].
    """
    t, (u, width) = x.shape[0], packed.mask.shape
    rep, qk_width = heads // kv_heads, (heads + kv_heads) * head_dim
    qkv = ops.linear(norm(x, p.ln1, eps), p.qkv, p.qkv_bias)                            # [T, (H+2Hkv)·Dh]
    qk = qkv[:, :qk_width].view(t, heads + kv_heads, head_dim)
    qkv[:, :qk_width] = torch.addcmul(qk * cos, qk.roll(head_dim // 2, dims=-1), sin).view(t, qk_width)   # rotary
    grid = qkv.new_zeros(u, width, qkv.shape[1])                                         # [U, P, (H+2Hkv)·Dh]
    grid.view(u * width, -1).index_copy_(0, packed.grid, qkv)                            # padding stays 0 (finite)
    q = grid[..., :heads * head_dim].view(u, width, kv_heads, rep, head_dim).permute(0, 2, 3, 1, 4)  # [U,Hkv,rep,P,Dh]
    k = grid[..., heads * head_dim:qk_width].view(u, width, kv_heads, head_dim).transpose(1, 2)    # [U, Hkv, P, Dh]
    v = grid[..., qk_width:].view(u, width, kv_heads, head_dim).transpose(1, 2)                    # [U, Hkv, P, Dh]
    keys[:, :, :width] = k[rows]
    values[:, :, :width] = v[rows]
    # grouped-query attention as two matmuls: [U, Hkv, rep·P, Dh] x [U, Hkv, Dh, P], mask per prompt
    scores = torch.matmul(q.reshape(u, kv_heads, rep * width, head_dim), k.transpose(2, 3))       # [U,Hkv,rep·P,P]
    scores = scores.view(u, kv_heads, rep, width, width).add_(packed.attn.unsqueeze(1))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype).view(u, kv_heads, rep * width, width)
    a = torch.matmul(probs, v).view(u, kv_heads, rep, width, head_dim).permute(0, 3, 1, 2, 4)     # [U,P,Hkv,rep,Dh]
    a = a.reshape(u * width, heads * head_dim).index_select(0, packed.grid)             # [T, H·Dh]
    return ops.mlp_residual(ops.residual(x, a, p.o, p.o_bias), p, eps)
