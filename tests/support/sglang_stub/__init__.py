"""SGLang test support: the CPU import stub folder (STUB_DIR, put on the server's PYTHONPATH), the python of SGLang's
own venv, a test server on CPU, and a tiny model SGLang can run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

STUB_DIR = Path(__file__).resolve().parent
ROOT = STUB_DIR.parents[2]
INSTALL_HINT = "bash scripts/install_sglang_cpu.sh (creates .venv-sglang, ~2 min)"


def sglang_python() -> Path | None:
    """RLFLEET_SGLANG_PYTHON, else the repo's .venv-sglang; None when neither exists."""
    python = Path(os.environ.get("RLFLEET_SGLANG_PYTHON", str(ROOT / ".venv-sglang" / "bin" / "python")))
    return python if python.exists() else None


def tiny_llama_state(seed: int, layers: int = 2) -> tuple[object, dict]:
    """(config, state_dict) of a tiny random llama: hidden 128 with 2 heads (head_dim 64, which SGLang's CPU path
    needs), the addition tokenizer's 19-token vocabulary, wide enough init that greedy decoding is not one token."""
    import torch
    from transformers import LlamaForCausalLM

    from examples.addition.model import tiny_llama_config
    from examples.addition.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = tiny_llama_config(len(tok), hidden=128, layers=layers, heads=2, bos=tok.bos_token_id,
                            eos=tok.eos_token_id, pad=tok.pad_token_id)
    cfg.max_position_embeddings = 256
    cfg.initializer_range = 0.2
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    return cfg, model.state_dict()


def make_sglang_tiny_model(path: Path, seed: int = 0, layers: int = 2) -> Path:
    """Write the tiny llama of tiny_llama_state (float32 safetensors) with its tokenizer to path."""
    import torch
    from transformers import LlamaForCausalLM

    from examples.addition.tokenizer import save_tokenizer

    path = Path(path)
    save_tokenizer(path)
    cfg, state = tiny_llama_state(seed, layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.load_state_dict(state, assign=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def server_spec(model_path: Path, python: Path, **kwargs: Any):  # -> SGLangServerSpec
    """A CPU float32 server spec with the import stub on its PYTHONPATH."""
    from rlfleet.services.rollout.engines.sglang.server import SGLangServerSpec

    return SGLangServerSpec(model_path=Path(model_path), python=python, pythonpath=(STUB_DIR,), dtype="float32",
                            device="cpu", **kwargs)


def make_sglang_tiny_moe(path: Path, seed: int = 0) -> Path:
    """A tiny random Mixtral SGLang runs on CPU (head_dim 64; Qwen2-MoE's shared-expert gate is a triton kernel
    there): 2 MoE layers of 8 experts, top-2, vocab 32, float32 safetensors without a tokenizer (the server runs
    with --skip-tokenizer-init). Router rows drawn wide so routes have clear margins on both engines."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=32, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, num_experts_per_tok=2, num_local_experts=8, intermediate_size=32,
                        max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0)
    torch.manual_seed(seed)
    model = MixtralForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
            layer.mlp.experts.gate_up_proj.normal_(0, 0.3)
            layer.mlp.experts.down_proj.normal_(0, 0.3)
        model.lm_head.weight.normal_(0, 0.3)
    model.save_pretrained(str(path), safe_serialization=True)
    return Path(path)
