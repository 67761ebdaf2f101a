"""A lean decode step for Llama-family models (llama, qwen2, mistral without sliding window): the same math as the
HF modules in about 18 tensor ops a layer where the modules run ~45, writing keys and values into slack-padded cache
buffers.

On small models a decode step is per-op overhead, on larger ones it is matmuls; both shrink here:
- q/k/v and gate/up are one matmul each (`fused_params.py`: the modules' weights become row views of the fused
  matrices, so weight updates, digests and the prefill's HF forward see the same memory);
- rotary embedding of q and k together, in three ops: cos/sin come from a table indexed by position, the attention
  scale 1/sqrt(Dh) is folded into q's cos/sin, and rotate_half(x)·sin is roll(x)·(±sin);
- grouped-query attention without repeating keys/values: q is viewed as [B, Hkv, H/Hkv, Dh] against the cache's
  [B, Hkv, L, Dh], two matmuls and a softmax for the one query per row, or on a CPU with AVX-512 and one thread
  one C kernel call (native_attention.py: ~2x faster; `perf.native_attention`);
- RMSNorm as one fused op (fp32; other dtypes keep HF's cast order), the residual adds folded into the output
  matmuls (addmm).
Each layer's keys/values live in a buffer with room for more columns (`room`: the most tokens a running request may
still add, at most SLACK; on a CPU at most `cpu_slack`, a few columns, re-buffered into reused storage: see there):
appending writes one column in place and the DynamicLayer's keys/values become a view of it, so `kv_cache.merge`
keeps working unchanged (it makes fresh tensors; the next append re-buffers them). Rows that finish leave through
`select`: one `index_select` of each layer's whole buffer (its spare columns included), where `kv_cache.select`
copied the rows and the next append copied them again into a new buffer; it falls back to that when the spare
columns would make the one copy larger than the two (a long generation early on).

`supports(model)` says whether a model qualifies (no MoE, full attention, silu MLP, plain RMSNorm, linear
projections, none tied). Optional `torch.compile` of the per-layer step (`compile=True`; off by default) is kept
off-switchable for callers that must run uncompiled. Prefill is fast_prefill.py's packed step; the MLP block and
the LM head of both run feature-major (llama_ops.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from rlfleet.cpu_kernels import fused_rms_norm as norm
from rlfleet.services.rollout.engines import kv_cache
from rlfleet.services.rollout.engines.decoder import Decoded, Prefilled
from rlfleet.services.rollout.engines.lean_llama.fast_prefill import pack, prefill_layer
from rlfleet.services.rollout.engines.lean_llama.fused_params import LayerParams, fuse_layers, shared_parameters
from rlfleet.services.rollout.engines.lean_llama.llama_ops import Linears, Rotary, pick_linears
from rlfleet.services.rollout.engines.lean_llama.native_attention import NativeAttention, load_for

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")
SLACK = 64                     # most spare cache columns allocated per re-buffering
CPU_GAP_BYTES = 512            # CPU: spare columns per (row, head) block stay under this many bytes (see cpu_slack)


def cpu_slack(head_dim: int, itemsize: int) -> int:
    """Spare columns per re-buffering on a CPU: fewer than CPU_GAP_BYTES of unused cache between one (row, head)
    block's last column and the next block's first.

    Attention reads each block's first L+1 columns; the unused columns after them are a gap in an otherwise
    sequential read, and a gap of 4 or more 128-byte rows makes the CPU's hardware prefetcher lose the stream: on
    the Zen 4 here a [256 x 1 x 32] x [32 x 60] bmm over 8 such caches took 98-158 us a cache with gaps of up to 3
    rows and 309-412 us with gaps of 4 to 16. Re-buffering every few steps (one copy of the cache) costs less than
    reading it 2.5-3x slower twice a step. A GPU has no such cliff and keeps SLACK."""
    return max(1, CPU_GAP_BYTES // (head_dim * itemsize))


def supports(model: nn.Module) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "sliding_window", None) and \
            getattr(cfg, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ["full_attention"])):
        return False
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return False
    tied = shared_parameters(model)
    for layer in inner.layers:
        at, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(at, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
            [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(m) is not nn.Linear or id(m.weight) in tied for m in projections):
            return False
    return True


def _layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor,
           values: torch.Tensor, length: int, p: LayerParams, heads: int, kv_heads: int, head_dim: int,
           eps: float, ops: Linears, attention: NativeAttention | None = None) -> torch.Tensor:
    """One decoder layer for one new token per row.

    x: [B, D]; cos, sin: [B, H+Hkv, Dh] (q's heads scaled by 1/sqrt(Dh), sin signed for roll); mask: [B, 1, 1, L+1]
    additive (0 or -inf); keys, values: [B, Hkv, C, Dh] buffers whose first `length` columns hold the cache (column
    `length` is written here); attention: the C kernel for q against the cache, else torch's ops. Returns x [B, D].
    """
    b = x.shape[0]
    qk_width = (heads + kv_heads) * head_dim
    qkv = ops.linear(norm(x, p.ln1, eps), p.qkv, p.qkv_bias)                        # [B, (H+2Hkv)·Dh]
    qk = qkv[:, :qk_width].view(b, heads + kv_heads, head_dim)                       # [B, H+Hkv, Dh]
    qk = torch.addcmul(qk * cos, qk.roll(head_dim // 2, dims=-1), sin)               # rotary (and q's scale)
    k_new, v_new = qk[:, heads:], qkv[:, qk_width:].view(b, kv_heads, head_dim)      # [B, Hkv, Dh] each
    q = qk[:, :heads].reshape(b, kv_heads, heads // kv_heads, head_dim)             # [B, Hkv, rep, Dh]
    if attention is not None:                     # native_attention.py: appends k_new/v_new at column `length` too
        a = attention.attend(q, keys, values, mask, length + 1, (k_new, v_new)).view(b, heads * head_dim)
    else:
        keys[:, :, length] = k_new
        values[:, :, length] = v_new
        scores = torch.matmul(q, keys[:, :, :length + 1].transpose(2, 3)).add_(mask)    # [B, Hkv, rep, L+1]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(probs, values[:, :, :length + 1]).view(b, heads * head_dim)    # [B, H·Dh]
    return ops.mlp_residual(ops.residual(x, a, p.o, p.o_bias), p, eps)


def _within(view: torch.Tensor, flat: torch.Tensor) -> bool:
    """Whether tensor `view` starts inside the 1-D tensor `flat`'s memory."""
    start = flat.data_ptr()
    return start <= view.data_ptr() < start + flat.numel() * flat.element_size()


class FastDecoder:
    """The lean Decoder (engines/decoder.py): decode(cache, last [B], pos [B], mask [B, L+1]) -> Decoded with logits
    [B, V], the cache extended by one column in place; prefill and select as the Decoder contract says.

    Construction fuses the model's q/k/v and gate/up weights in place (fused_params.py); the model keeps working
    through its own modules, on the same memory. `slack`: the most spare cache columns a re-buffering allocates
    (default: SLACK, on a CPU `cpu_slack`)."""

    def __init__(self, model: nn.Module, compile: bool = False, slack: int | None = None, onednn: bool = True,
                 native_attention: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.inner = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.params = fuse_layers(model)
        weight = self.inner.embed_tokens.weight
        self.rotary = Rotary(self.inner.rotary_emb, self.heads, self.kv_heads, self.head_dim,
                              self.head_dim ** -0.5, weight.dtype, weight.device)
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}     # layer -> (keys, values) buffers
        self._pool: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # layer -> flat storages (_storage)
        self.ops = pick_linears(weight, onednn)
        on_cpu = weight.device.type == "cpu"
        self.native = load_for(weight.device, weight.dtype, self.head_dim) if native_attention and not compile \
            else None
        self.slack = slack or (cpu_slack(self.head_dim, weight.element_size()) if on_cpu else SLACK)
        self._layer: Callable[..., torch.Tensor] = torch.compile(_layer, dynamic=True) if compile else _layer

    def _room(self, i: int, keys: torch.Tensor, values: torch.Tensor, room: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers [B, Hkv, C, Dh] with C > L whose first L columns are the layer's cache (copied into buffers of
        L + room columns when the cache is not already a view of this layer's buffers with a free column)."""
        grow, room = room, min(room, self.slack)
        held = self._buffers.get(i)
        b, hk, length, d = keys.shape
        if held is not None and held[0].shape[0] == b and held[0].shape[2] > length and \
                self._in_buffers(i, keys, values):
            return held
        shape = (b, hk, length + room, d)
        need = b * hk * (length + room) * d
        kflat, vflat = self._storage(i, keys, values, need, b * hk * (length + grow) * d)
        kb, vb = kflat[:need].view(shape), vflat[:need].view(shape)
        kb[:, :, :length] = keys
        vb[:, :, :length] = values
        self._buffers[i] = (kb, vb)
        return kb, vb

    def _storage(self, i: int, keys: torch.Tensor, values: torch.Tensor, need: int, size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat storage of at least `need` elements each for layer i's next keys and values buffers: one of the two
        this layer re-buffered into last that the cache (keys, values) does not use, else new ones of `size`
        elements (room for every column the running requests may still add, at most SLACK: reused to the end).
        Fresh memory of this size comes from mmap and costs a page fault a 4 KiB page on its first write:
        re-buffering every few columns into new memory made the copies slower than all the attention reads
        (engine profile, addition model, 64 x 64 tokens: copy_ 117 ms vs bmm 49 ms; 51 ms with reuse). Only the
        cache can hold views of these (the engine keeps no other reference to its tensors), so storage the cache
        is not in is free. What it costs: each layer holds two storages the size one buffer had before the cap."""
        pool = self._pool.setdefault(i, [])
        for kflat, vflat in pool:
            if kflat.numel() >= need and not _within(keys, kflat) and not _within(values, vflat):
                return kflat, vflat
        fresh = keys.new_empty(size), values.new_empty(size)
        pool.append(fresh)
        del pool[:-2]
        return fresh

    def _in_buffers(self, i: int, keys: torch.Tensor, values: torch.Tensor) -> bool:
        """Whether layer i's cache keys/values are views of the start of its buffers."""
        held = self._buffers.get(i)
        return held is not None and keys.data_ptr() == held[0].data_ptr() and keys.stride() == held[0].stride() \
            and values.data_ptr() == held[1].data_ptr()

    def prefill(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, room: int = SLACK) -> Prefilled:
        """Prefill U distinct prompts for N requests (rows [N]: the prompt of each) with fast_prefill's packed step.

        Returns the cache, whose layers are views of this decoder's slack buffers [N, Hkv, P + room, Dh] (room at
        most SLACK and `slack`), the mask [N, P] and the logits [N, V] of each prompt's last token."""
        weight = self.inner.embed_tokens.weight
        room = min(room, SLACK, self.slack)
        packed = pack(prompts, weight.dtype, weight.device)
        n, width = rows.shape[0], packed.mask.shape[1]
        x = self.inner.embed_tokens(packed.ids)                                         # [T, D]
        cos, sin = self.rotary(packed.pos)                                              # [T, H+Hkv, Dh]
        cache = DynamicCache(config=self.model.config)
        for i, (p, cl) in enumerate(zip(self.params, cache.layers, strict=True)):
            kb = weight.new_empty(n, self.kv_heads, width + room, self.head_dim)
            vb = torch.empty_like(kb)
            x = prefill_layer(x, p, packed, cos, sin, kb, vb, rows, self.heads, self.kv_heads, self.head_dim,
                              self.eps, self.ops)
            cl.lazy_initialization(kb, vb)
            cl.keys, cl.values = kb[:, :, :width], vb[:, :, :width]
            self._buffers[i] = (kb, vb)
        x = norm(x.index_select(0, packed.last), self.inner.norm.weight, self.inner.norm.variance_epsilon)  # [U, D]
        return Prefilled(cache=cache, mask=packed.mask[rows],
                         logits=self.ops.lm_head(x, self.model.lm_head)[rows])                       # logits: [N, V]

    def decode(self, cache: DynamicCache, last: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
               room: int = SLACK) -> Decoded:
        """One step for B rows; the cache's layers gain a column in place (in buffers with up to min(room, SLACK)
        spare columns)."""
        room = min(room, SLACK)
        x = self.inner.embed_tokens(last)                                                # [B, D]
        cos, sin = self.rotary(pos)                                                      # [B, H+Hkv, Dh]
        attn_mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(
            mask == 0, float("-inf"))[:, None, None, :]                                 # [B, 1, 1, L+1]
        attention = self.native if self.native is not None and torch.get_num_threads() == 1 else None
        for i, (p, cl) in enumerate(zip(self.params, cache.layers, strict=True)):
            length = cl.keys.shape[2]
            kb, vb = self._room(i, cl.keys, cl.values, room)
            x = self._layer(x, cos, sin, attn_mask, kb, vb, length, p, self.heads, self.kv_heads, self.head_dim,
                            self.eps, self.ops, attention)
            cl.keys, cl.values = kb[:, :, :length + 1], vb[:, :, :length + 1]
        x = norm(x, self.inner.norm.weight, self.inner.norm.variance_epsilon)
        return Decoded(cache=cache, logits=self.ops.lm_head(x, self.model.lm_head))        # logits: [B, V]

    def select(self, cache: DynamicCache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """kv_cache.select (keep `rows` [R], drop columns that became all padding; returns the mask [R, L']), each
        layer whose cache is a view of its buffers compacted by one copy of the buffers' rows, spare columns
        included, when that copies at most twice the cache's columns (kv_cache.select's copy plus the re-buffering
        copy at the next append)."""
        mask = mask[rows]
        start = kv_cache.first_real_column(mask)
        for i, cl in enumerate(cache.layers):
            keys, values = cl.keys, cl.values
            length = keys.shape[2]
            if self._in_buffers(i, keys, values) and self._buffers[i][0].shape[2] - start <= 2 * (length - start):
                kb_all, vb_all = self._buffers[i]
                kb = kb_all.index_select(0, rows)[:, :, start:]                            # [R, Hkv, C', Dh]
                vb = vb_all.index_select(0, rows)[:, :, start:]
                self._buffers[i] = (kb, vb)
                cl.keys, cl.values = kb[:, :, :length - start], vb[:, :, :length - start]
            else:
                cl.keys, cl.values = keys[rows, :, start:], values[rows, :, start:]
        return mask[:, start:]
