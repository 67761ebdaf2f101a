"""Tiny random MoE causal LMs (Qwen2-MoE, Mixtral) for the routing-capture and routing-replay (R3) tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedModel, Qwen2MoeConfig, Qwen2MoeForCausalLM

VOCAB = 32
LAYERS = 2
EXPERTS = 8
TOP_K = 2


def build_tiny_moe(arch: str = "qwen2_moe", seed: int = 0, tie_eps: float | None = None) -> PreTrainedModel:
    """A ~60k-parameter MoE LM: hidden 32, LAYERS MoE layers of EXPERTS experts, top-TOP_K, vocab VOCAB.

    tie_eps: near ties. Every router row is one shared row plus tie_eps * noise, so the experts' logits differ by
    about tie_eps while each logit is O(1): a computation path whose rounding error is near tie_eps (fp32 ~1e-7,
    bf16 ~1e-2 relative) then picks other experts for some tokens. Experts get large distinct weights so a
    flipped route moves the output visibly. None: ordinary random routers (clear margins).
    """
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=TOP_K, max_position_embeddings=128,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    if arch == "qwen2_moe":
        model: PreTrainedModel = Qwen2MoeForCausalLM(Qwen2MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=16,
            num_experts=EXPERTS, norm_topk_prob=False))
    elif arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**common, intermediate_size=32, num_local_experts=EXPERTS))
    else:
        raise ValueError(f"unknown arch {arch}")
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.mlp.gate.weight                                        # [E, H]
            if tie_eps is None:
                gate.normal_(0, 0.5)
            else:
                gate.copy_(torch.randn(1, gate.shape[1]) + tie_eps * torch.randn_like(gate))
            layer.mlp.experts.gate_up_proj.normal_(0, 0.3)
            layer.mlp.experts.down_proj.normal_(0, 0.3)
        model.lm_head.weight.normal_(0, 0.3)
    return model.eval()


def make_tiny_moe(path: Path, arch: str = "qwen2_moe", seed: int = 0, tie_eps: float | None = None) -> Path:
    """build_tiny_moe saved as a float32 safetensors folder (what TorchEngine and FsdpBackend load)."""
    build_tiny_moe(arch, seed, tie_eps).save_pretrained(str(path))
    return Path(path)
