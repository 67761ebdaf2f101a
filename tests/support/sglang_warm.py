"""A warm start SGLang can serve on CPU: the addition recipe's supervised warm-up on a llama with head_dim 64.

The built-in warm start (examples/addition/warm_start.py: hidden 128, 4 heads of 32) does not fit SGLang's CPU
attention, which needs head_dim 64. Measured on this 2-core box (400 supervised steps, batch 64, 200 held-out
prompts): hidden 128 with 2 heads of 64 reached 0.025 (lr 1e-3) and 0.065 (lr 3e-3), too little reward for RL to
work with; hidden 256 with 4 heads of 64 and 2 layers reached 0.245 at lr 1e-3 (and 0.025 after 200 steps at 2e-3).
So: hidden 256, 4 heads, 2 layers, 400 steps at lr 1e-3, trained exactly like the built-in warm start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SFT_STEPS = 400
SFT_LR = 1e-3
HIDDEN = 256
LAYERS = 2


def prepare_sglang_warm_start(model_dir: Path, seed: int = 0, steps: int = SFT_STEPS, lr: float = SFT_LR,
                              hidden: int = HIDDEN, layers: int = LAYERS) -> Path:
    """model_dir: a float32 safetensors llama (head_dim 64) after `steps` supervised steps on the training prompts,
    with the addition tokenizer. Cached by a marker file (written to a temporary folder, then renamed)."""
    import torch
    from transformers import LlamaForCausalLM

    from examples.addition.model import tiny_llama_config
    from examples.addition.tokenizer import save_tokenizer
    from examples.addition.warm_start import supervised

    path = Path(model_dir)
    marker = path / "warm_start.json"
    recipe = {"steps": steps, "seed": seed, "lr": lr, "hidden": hidden, "heads": hidden // 64, "layers": layers}
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = save_tokenizer(tmp)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tok), hidden=hidden, layers=layers, heads=hidden // 64,
                                               bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id))
    supervised(model, tok, steps, seed, lr=lr)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "warm_start.json").write_text(json.dumps(recipe))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
