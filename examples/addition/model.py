"""A tiny Llama-style model (about 0.8M parameters) for the addition recipe, built from a config."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from examples.addition.tokenizer import save_tokenizer


def tiny_llama_config(vocab_size: int, hidden: int = 128, layers: int = 4, heads: int = 4,
                      bos: int = 1, eos: int = 2, pad: int = 0) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                       max_position_embeddings=64, rope_theta=10000.0, bos_token_id=bos, eos_token_id=eos,
                       pad_token_id=pad, tie_word_embeddings=True)


def build_random_model(path: Path, seed: int = 0, hidden: int = 128, layers: int = 4) -> LlamaForCausalLM:
    """Write a randomly initialised tiny llama with the character tokenizer to path (safetensors)."""
    path = Path(path)
    tok = save_tokenizer(path)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tok), hidden=hidden, layers=layers, bos=tok.bos_token_id,
                                               eos=tok.eos_token_id, pad=tok.pad_token_id))
    model.save_pretrained(str(path), safe_serialization=True)
    return model
