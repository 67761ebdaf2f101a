"""A lean decode step for Llama-family models (llama, qwen2, mistral without sliding window): the same math as the
HF modules, without their per-call overhead, writing keys and values into slack-padded cache buffers.

On small models a decode step is Python overhead: ~30 nn.Module calls per layer, kwargs plumbing, a 4-D mask built
each step, and a torch.cat that copies the whole KV cache of every layer for every new token. Here one function
walks the layers with functional ops on the model's own parameters (so weight updates are seen at once), and each
layer's keys/values live in a buffer with room for `SLACK` more columns: appending writes one column in place and
the DynamicLayer's keys/values become a view of it, so `kv_cache.merge/select` keep working unchanged (they make
fresh tensors; the next append re-buffers them).

`supports(model)` says whether a model qualifies (no MoE, full attention, silu MLP, plain RMSNorm). Optional
`torch.compile` of the per-layer step (`compile=True`; off by default) is kept off-switchable for callers that must
run uncompiled. Prefill stays the HF forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")
SLACK = 64                     # spare cache columns allocated per re-buffering


def supports(model: torch.nn.Module) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "sliding_window", None) and \
            getattr(cfg, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"])):
        return False
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor,
           values: torch.Tensor, length: int, w: tuple, heads: int, kv_heads: int, head_dim: int, eps: float,
           scale: float) -> torch.Tensor:
    """One decoder layer for one new token per row.

    x: [B, 1, D]; cos, sin: [B, 1, Dh]; mask: [B, 1, 1, L+1] additive (0 or -inf); keys, values: [B, Hkv, C, Dh]
    buffers whose first `length` columns hold the cache (column `length` is written here). Returns x [B, 1, D].
    """
    (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, bg, wu, bu, wd, bd) = w
    b = x.shape[0]
    h = _rms(x, ln1, eps)
    q = F.linear(h, wq, bq).view(b, 1, heads, head_dim).transpose(1, 2)                # [B, H, 1, Dh]
    k = F.linear(h, wk, bk).view(b, 1, kv_heads, head_dim).transpose(1, 2)             # [B, Hkv, 1, Dh]
    v = F.linear(h, wv, bv).view(b, 1, kv_heads, head_dim).transpose(1, 2)             # [B, Hkv, 1, Dh]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)                                          # [B, 1, 1, Dh]
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    keys[:, :, length:length + 1] = k
    values[:, :, length:length + 1] = v
    kk, vv = keys[:, :, :length + 1], values[:, :, :length + 1]                        # [B, Hkv, L+1, Dh]
    if kv_heads != heads:
        rep = heads // kv_heads
        kk = kk[:, :, None].expand(b, kv_heads, rep, length + 1, head_dim).reshape(b, heads, length + 1, head_dim)
        vv = vv[:, :, None].expand(b, kv_heads, rep, length + 1, head_dim).reshape(b, heads, length + 1, head_dim)
    # one query per row: two small matmuls and a softmax beat SDPA's CPU path here (bench/engine_decode.py)
    scores = torch.matmul(q, kk.transpose(2, 3)) * scale + mask                         # [B, H, 1, L+1]
    a = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), vv)  # [B, H, 1, Dh]
    a = F.linear(a.transpose(1, 2).reshape(b, 1, heads * head_dim), wo, bo)
    x = x + a
    h = _rms(x, ln2, eps)
    return x + F.linear(F.silu(F.linear(h, wg, bg)) * F.linear(h, wu, bu), wd, bd)


class FastDecoder:
    """decode(cache, last [B], pos [B], mask [B, L+1]) -> logits [B, V], with the cache extended by one column."""

    def __init__(self, model: torch.nn.Module, compile: bool = False) -> None:
        cfg = model.config
        self.model = model
        self.inner = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}     # layer -> (keys, values) buffers
        self._layer: Callable[..., torch.Tensor] = torch.compile(_layer, dynamic=True) if compile else _layer

    def _weights(self, layer: torch.nn.Module) -> tuple:
        at, mlp = layer.self_attn, layer.mlp
        return (layer.input_layernorm.weight, at.q_proj.weight, at.q_proj.bias, at.k_proj.weight, at.k_proj.bias,
                at.v_proj.weight, at.v_proj.bias, at.o_proj.weight, at.o_proj.bias,
                layer.post_attention_layernorm.weight, mlp.gate_proj.weight, mlp.gate_proj.bias, mlp.up_proj.weight,
                mlp.up_proj.bias, mlp.down_proj.weight, mlp.down_proj.bias)

    def _room(self, i: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers [B, Hkv, C, Dh] with C > L whose first L columns are the layer's cache (copied when the cache is
        not already a view of this layer's buffers with a free column)."""
        held = self._buffers.get(i)
        b, hk, length, d = keys.shape
        if held is not None:
            kb, vb = held
            if kb.shape[0] == b and kb.shape[2] > length and keys.data_ptr() == kb.data_ptr() and \
                    values.data_ptr() == vb.data_ptr() and keys.stride() == kb.stride():
                return kb, vb
        kb = keys.new_empty(b, hk, length + SLACK, d)
        vb = values.new_empty(b, hk, length + SLACK, d)
        kb[:, :, :length] = keys
        vb[:, :, :length] = values
        self._buffers[i] = (kb, vb)
        return kb, vb

    def decode(self, cache: DynamicCache, last: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.inner.embed_tokens(last.unsqueeze(1))                                  # [B, 1, D]
        cos, sin = self.inner.rotary_emb(x, pos.unsqueeze(1))                           # [B, 1, Dh]
        attn_mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(
            mask == 0, float("-inf"))[:, None, None, :]                                 # [B, 1, 1, L+1]
        for i, (layer, cl) in enumerate(zip(self.inner.layers, cache.layers, strict=True)):
            length = cl.keys.shape[2]
            kb, vb = self._room(i, cl.keys, cl.values)
            x = self._layer(x, cos, sin, attn_mask, kb, vb, length, self._weights(layer), self.heads, self.kv_heads,
                            self.head_dim, self.eps, self.scale)
            cl.keys, cl.values = kb[:, :, :length + 1], vb[:, :, :length + 1]
        x = _rms(x, self.inner.norm.weight, self.inner.norm.variance_epsilon)
        return self.model.lm_head(x)[:, -1]                                              # [B, V]
