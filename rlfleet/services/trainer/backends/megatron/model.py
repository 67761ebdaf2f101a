"""Megatron-core GPTModel built from an HF Llama / Qwen2 config: RMSNorm, SwiGLU, RoPE, GQA, tied or untied
embeddings, Qwen2's QKV bias. Uses the local (non-TransformerEngine) layer spec, whose parameter names
convert.py maps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelShape:
    """The architecture facts the conversion and the model need, read from an HF config."""

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    max_positions: int
    rope_theta: float
    norm_eps: float
    tied: bool
    qkv_bias: bool

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.kv_heads


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ValueError(f"rope type '{kind}' is not supported by the Megatron backend (only plain RoPE)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("HF config has no rope_theta")
    return float(theta)


def model_shape(hf_config: Any) -> ModelShape:
    """ModelShape of an HF Llama/Qwen2/Mistral config; raises ValueError for what the backend cannot build."""
    kind = getattr(hf_config, "model_type", "")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type '{kind}' is not supported by the Megatron backend ({SUPPORTED_MODEL_TYPES})")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act '{hf_config.hidden_act}': only SwiGLU (silu) is supported")
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", True) \
            and kind == "mistral":
        raise ValueError("sliding-window attention is not supported by the Megatron backend")
    heads = int(hf_config.num_attention_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads)
    return ModelShape(
        vocab_size=int(hf_config.vocab_size), hidden=int(hf_config.hidden_size),
        layers=int(hf_config.num_hidden_layers), heads=heads,
        kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads), head_dim=head_dim,
        ffn_hidden=int(hf_config.intermediate_size), max_positions=int(hf_config.max_position_embeddings),
        rope_theta=_rope_theta(hf_config), norm_eps=float(hf_config.rms_norm_eps),
        tied=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
    )


def padded_vocab(vocab_size: int, tp: int) -> int:
    """Vocabulary rounded up so that every tensor-parallel rank holds the same number of rows."""
    return -(-vocab_size // tp) * tp


@dataclass(frozen=True)
class Precision:
    """params: the dtype of the parameters (and master weights); compute: autocast dtype on CUDA, or None."""

    params: torch.dtype = torch.float32
    compute: torch.dtype | None = None


def transformer_config(shape: ModelShape, tp: int, pp: int, device: torch.device,
                       precision: Precision = Precision(), recompute: bool = False) -> Any:
    """Megatron TransformerConfig matching the HF model; fusions off so that the math follows HF's.
    recompute: full activation recomputation of every layer (megatron's checkpointing needs CUDA RNG states)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if shape.kv_heads % tp or shape.heads % tp:
        raise ValueError(f"tensor_parallel={tp} must divide attention heads {shape.heads} and kv heads "
                         f"{shape.kv_heads}")
    if shape.layers % pp:
        raise ValueError(f"pipeline_parallel={pp} must divide the {shape.layers} layers")
    autocast = precision.compute is not None and device.type == "cuda"
    return TransformerConfig(
        num_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        num_query_groups=shape.kv_heads, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn_hidden,
        normalization="RMSNorm", layernorm_epsilon=shape.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=shape.qkv_bias, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        params_dtype=precision.params, bf16=precision.params == torch.bfloat16,
        fp16=precision.params == torch.float16,
        enable_autocast=autocast, autocast_dtype=precision.compute if autocast else None,
        pipeline_dtype=(precision.compute if autocast else precision.params),
        # microbatches differ in length: the pipeline exchanges shapes (the MoE dispatcher setting only satisfies
        # a config check: there are no experts)
        variable_seq_lengths=pp > 1, moe_token_dispatcher_type="alltoall", calculate_per_token_loss=True,
        use_cpu_initialization=device.type != "cuda", perform_initialization=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        **({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
           if recompute else {}),
    )


def build_gpt_model(shape: ModelShape, config: Any, pre_process: bool, post_process: bool) -> torch.nn.Module:
    """The GPTModel of this pipeline stage (parallel_state must be initialised). Weights are uninitialised:
    load them with convert.py."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=padded_vocab(shape.vocab_size, config.tensor_model_parallel_size),
        max_sequence_length=shape.max_positions, pre_process=pre_process, post_process=post_process,
        parallel_output=True, share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="rope", rotary_percent=1.0, rotary_base=int(shape.rope_theta)
        if float(shape.rope_theta).is_integer() else shape.rope_theta,
    )
