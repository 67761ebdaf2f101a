"""Exact HF <-> Megatron-core (local layer spec) weight conversion, with tensor- and pipeline-parallel sharding.

Megatron layouts (tp = tensor-parallel size, r = tp rank, g = query group, d = head_dim, hpg = heads per group):
  linear_qkv.weight  [(hpg + 2) * d * kv_heads / tp, H]: per group g the rows [q heads of g | k_g | v_g];
                     rank r holds groups r*kv/tp .. (r+1)*kv/tp - 1 (the same layout for the Qwen2 bias).
  linear_fc1.weight  [2 * I / tp, H]: rank r holds [gate rows of r | up rows of r].
  linear_proj, linear_fc2: row-parallel, split along the input dim (1).
  word_embeddings / output_layer: vocab padded to a multiple of tp with zero rows, split along dim 0.
Layers are numbered locally on each pipeline stage: global = stage * layers / pp + local.
Every function here is pure tensor reshuffling: HF -> shards -> HF is bit-exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlfleet.services.trainer.backends.megatron.model import ModelShape, padded_vocab

EMBED, NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
MG_EMBED, MG_NORM, MG_OUTPUT = "embedding.word_embeddings.weight", "decoder.final_layernorm.weight", \
    "output_layer.weight"

# per-layer: megatron suffix -> (kind, HF suffixes). kind says how it is fused and split.
_LAYER: dict[str, tuple[str, tuple[str, ...]]] = {
    "input_layernorm.weight": ("replicated", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": ("qkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                 "self_attn.v_proj.weight")),
    "self_attention.linear_qkv.bias": ("qkv", ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                               "self_attn.v_proj.bias")),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("replicated", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("gate_up", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("mlp.down_proj.weight",)),
}


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: tensor-parallel rank/size and pipeline stage/count."""

    tp_rank: int = 0
    tp: int = 1
    pp_rank: int = 0
    pp: int = 1

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def stage_layers(shape: ModelShape, pp_rank: int, pp: int) -> range:
    """Global indices of the decoder layers on pipeline stage pp_rank."""
    per = shape.layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


def _layer_suffixes(shape: ModelShape) -> list[str]:
    return [s for s in _LAYER if shape.qkv_bias or not s.endswith("linear_qkv.bias")]


def megatron_names(shape: ModelShape, layout: Layout) -> list[str]:
    """Parameter names of this stage's GPTModel (local layer numbers)."""
    names = [MG_EMBED] if layout.first_stage else []
    for local in range(len(stage_layers(shape, layout.pp_rank, layout.pp))):
        names += [f"decoder.layers.{local}.{s}" for s in _layer_suffixes(shape)]
    if layout.last_stage:
        names.append(MG_NORM)
        if not shape.tied or layout.pp > 1:
            names.append(MG_OUTPUT)
    return names


def hf_names_of(shape: ModelShape, name: str, pp_rank: int, pp: int) -> tuple[str, ...]:
    """The HF names a Megatron parameter of stage pp_rank is made of."""
    if name == MG_EMBED:
        return (EMBED,)
    if name == MG_NORM:
        return (NORM,)
    if name == MG_OUTPUT:
        return (EMBED,) if shape.tied else (LM_HEAD,)
    _, _, local, suffix = name.split(".", 3)
    layer = stage_layers(shape, pp_rank, pp)[int(local)]
    return tuple(f"model.layers.{layer}.{h}" for h in _LAYER[suffix][1])


def _kind(name: str) -> str:
    if name in (MG_EMBED, MG_OUTPUT):
        return "vocab"
    if name == MG_NORM:
        return "replicated"
    return _LAYER[name.split(".", 3)[3]][0]


def _pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    if w.shape[0] == rows:
        return w
    return torch.cat([w, w.new_zeros((rows - w.shape[0], *w.shape[1:]))])


def _fuse_qkv(shape: ModelShape, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q: [heads*d, ...], k, v: [kv*d, ...] -> [kv, (hpg+2)*d, ...] -> [(hpg+2)*d*kv, ...]
    d, g, hpg = shape.head_dim, shape.kv_heads, shape.heads_per_group
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return fused.reshape(g * (hpg + 2) * d, *rest)


def _split_qkv(shape: ModelShape, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d, g, hpg = shape.head_dim, shape.kv_heads, shape.heads_per_group
    rest = fused.shape[1:]
    grouped = fused.reshape(g, (hpg + 2) * d, *rest)                       # [kv, (hpg+2)*d, ...]
    q, k, v = grouped.split([hpg * d, d, d], dim=1)
    return q.reshape(g * hpg * d, *rest), k.reshape(g * d, *rest), v.reshape(g * d, *rest)


def shard(shape: ModelShape, name: str, hf: Mapping[str, torch.Tensor], layout: Layout) -> torch.Tensor:
    """This rank's Megatron tensor `name` from the full HF state dict."""
    parts = [hf[n] for n in hf_names_of(shape, name, layout.pp_rank, layout.pp)]
    kind, r, tp = _kind(name), layout.tp_rank, layout.tp
    if kind == "replicated":
        return parts[0].clone()
    if kind == "vocab":
        return _pad_rows(parts[0], padded_vocab(shape.vocab_size, tp)).chunk(tp, dim=0)[r].clone()
    if kind == "row":
        return parts[0].chunk(tp, dim=1)[r].clone()
    if kind == "gate_up":
        gate, up = parts
        return torch.cat([gate.chunk(tp, dim=0)[r], up.chunk(tp, dim=0)[r]]).clone()
    if kind == "qkv":
        return _fuse_qkv(shape, *parts).chunk(tp, dim=0)[r].clone()
    raise AssertionError(kind)


def tp_dim(name: str) -> int | None:
    """The dimension a Megatron tensor is split along across tensor-parallel ranks (None: replicated)."""
    kind = _kind(name)
    return None if kind == "replicated" else 1 if kind == "row" else 0


def unshard(shape: ModelShape, name: str, shards: Sequence[torch.Tensor], pp_rank: int, pp: int
            ) -> dict[str, torch.Tensor]:
    """HF tensors from a Megatron tensor's shards of every tensor-parallel rank (in rank order)."""
    hf_names = hf_names_of(shape, name, pp_rank, pp)
    kind = _kind(name)
    if name == MG_OUTPUT and shape.tied:
        hf_names = (LM_HEAD,)                       # the last stage's copy of the tied embedding
    if kind == "replicated":
        return {hf_names[0]: shards[0]}
    if kind == "vocab":
        return {hf_names[0]: torch.cat(list(shards))[:shape.vocab_size]}
    if kind == "row":
        return {hf_names[0]: torch.cat(list(shards), dim=1)}
    if kind == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return {hf_names[0]: torch.cat([h[0] for h in halves]), hf_names[1]: torch.cat([h[1] for h in halves])}
    if kind == "qkv":
        return dict(zip(hf_names, _split_qkv(shape, torch.cat(list(shards))), strict=True))
    raise AssertionError(kind)


def hf_layout(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """Every HF tensor name with its shape, in HF state-dict order (lm_head included also when tied, as HF's
    state_dict() lists it)."""
    h, d = shape.hidden, shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [(EMBED, (shape.vocab_size, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        for proj, rows in (("q", shape.heads * d), ("k", shape.kv_heads * d), ("v", shape.kv_heads * d)):
            out.append((f"{p}self_attn.{proj}_proj.weight", (rows, h)))
            if shape.qkv_bias:
                out.append((f"{p}self_attn.{proj}_proj.bias", (rows,)))
        out += [(f"{p}self_attn.o_proj.weight", (h, shape.heads * d)),
                (f"{p}mlp.gate_proj.weight", (shape.ffn_hidden, h)), (f"{p}mlp.up_proj.weight", (shape.ffn_hidden, h)),
                (f"{p}mlp.down_proj.weight", (h, shape.ffn_hidden)),
                (f"{p}input_layernorm.weight", (h,)), (f"{p}post_attention_layernorm.weight", (h,))]
    out += [(NORM, (h,)), (LM_HEAD, (shape.vocab_size, h))]
    return out


def hf_stage(shape: ModelShape, hf_name: str, pp: int) -> int:
    """The pipeline stage whose parameters produce `hf_name` when gathering (lm_head: the last stage)."""
    if hf_name == EMBED:
        return 0
    if hf_name in (NORM, LM_HEAD):
        return pp - 1
    layer = int(hf_name.split(".")[2])
    return layer // (shape.layers // pp)


def hf_to_megatron(shape: ModelShape, hf: Mapping[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """This rank's whole Megatron state dict (parameters only) from the full HF state dict."""
    return {name: shard(shape, name, hf, layout) for name in megatron_names(shape, layout)}
