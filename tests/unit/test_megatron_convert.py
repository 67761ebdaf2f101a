"""HF <-> Megatron weight conversion: sharding over tensor- and pipeline-parallel ranks and back is bit-exact, for
Llama (tied) and Qwen2 (GQA, QKV bias, untied) shapes; the fused layouts are the ones Megatron computes with."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from rlfleet.services.trainer.backends.megatron.convert import (
    EMBED,
    LM_HEAD,
    Layout,
    hf_layout,
    hf_stage,
    hf_to_megatron,
    megatron_names,
    tp_dim,
    unshard,
)
from rlfleet.services.trainer.backends.megatron.model import ModelShape, model_shape, padded_vocab


def _qwen2(tied: bool = False) -> ModelShape:
    return model_shape(Qwen2Config(vocab_size=19, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                                   tie_word_embeddings=tied))


def _llama() -> ModelShape:
    return model_shape(LlamaConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                   tie_word_embeddings=True))


def _random_hf(shape: ModelShape) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    state = {name: torch.randn(size, generator=g) for name, size in hf_layout(shape)}
    if shape.tied:
        state[LM_HEAD] = state[EMBED]
    return state


def _round_trip(shape: ModelShape, hf: dict[str, torch.Tensor], tp: int, pp: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for stage in range(pp):
        ranks = [hf_to_megatron(shape, hf, Layout(tp_rank=r, tp=tp, pp_rank=stage, pp=pp)) for r in range(tp)]
        assert list(ranks[0]) == megatron_names(shape, Layout(tp=tp, pp_rank=stage, pp=pp))
        for name in ranks[0]:
            shards = [ranks[r][name] for r in range(tp)]
            if tp_dim(name) is None:
                assert all(torch.equal(s, shards[0]) for s in shards)
            out.update(unshard(shape, name, shards, stage, pp))
    if shape.tied and pp == 1:
        out[LM_HEAD] = out[EMBED]
    return out


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (2, 2), (1, 4)])
@pytest.mark.parametrize("kind", ["qwen2", "qwen2_tied", "llama"])
def test_round_trip_is_bit_exact(kind: str, tp: int, pp: int) -> None:
    shape = {"qwen2": _qwen2(), "qwen2_tied": _qwen2(tied=True), "llama": _llama()}[kind]
    assert shape.layers % pp == 0 and shape.kv_heads % tp == 0       # every layout here divides every model
    hf = _random_hf(shape)
    back = _round_trip(shape, hf, tp, pp)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_fused_layouts_follow_megatron() -> None:
    """linear_qkv rows are [q heads of group g | k_g | v_g] per query group; fc1 per rank is [gate_r | up_r];
    the vocabulary is padded with zero rows to a multiple of tp."""
    shape = _qwen2()                                   # 8 heads, 4 kv heads: 2 q heads per group, head_dim 4
    hf = _random_hf(shape)
    d, p = shape.head_dim, "model.layers.0."
    full = hf_to_megatron(shape, hf, Layout())
    qkv = full["decoder.layers.0.self_attention.linear_qkv.weight"].reshape(4, 4 * d, -1)   # [kv, (2+2)*d, H]
    q, k, v = hf[p + "self_attn.q_proj.weight"], hf[p + "self_attn.k_proj.weight"], hf[p + "self_attn.v_proj.weight"]
    assert torch.equal(qkv[1, :2 * d], q[2 * d:4 * d])           # group 1 holds q heads 2 and 3
    assert torch.equal(qkv[1, 2 * d:3 * d], k[d:2 * d])
    assert torch.equal(qkv[1, 3 * d:], v[d:2 * d])
    bias = full["decoder.layers.0.self_attention.linear_qkv.bias"].reshape(4, 4 * d)
    assert torch.equal(bias[3, 3 * d:], hf[p + "self_attn.v_proj.bias"][3 * d:])

    rank1 = hf_to_megatron(shape, hf, Layout(tp_rank=1, tp=2))
    fc1 = rank1["decoder.layers.0.mlp.linear_fc1.weight"]                                # [2 * I / 2, H]
    assert torch.equal(fc1[:24], hf[p + "mlp.gate_proj.weight"][24:])
    assert torch.equal(fc1[24:], hf[p + "mlp.up_proj.weight"][24:])
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_proj.weight"],
                       hf[p + "self_attn.o_proj.weight"][:, 16:])
    emb = rank1["embedding.word_embeddings.weight"]                                       # rows 10..19 of 20
    assert padded_vocab(19, 2) == 20 and emb.shape == (10, 32)
    assert torch.equal(emb[:9], hf[EMBED][10:]) and not emb[9].any()


def test_stage_assignment_and_names() -> None:
    shape = _qwen2()
    assert hf_stage(shape, EMBED, 2) == 0 and hf_stage(shape, LM_HEAD, 2) == 1
    assert hf_stage(shape, "model.layers.1.mlp.up_proj.weight", 2) == 0
    assert hf_stage(shape, "model.layers.2.mlp.up_proj.weight", 2) == 1
    last = megatron_names(shape, Layout(pp_rank=1, pp=2))
    assert "embedding.word_embeddings.weight" not in last and "output_layer.weight" in last
    assert "output_layer.weight" not in megatron_names(_llama(), Layout())      # tied, one stage: no copy


def test_unsupported_configs_are_refused() -> None:
    cfg = LlamaConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="rope"):
        model_shape(cfg)
