"""A warm start SGLang can serve on CPU: the addition recipe's supervised warm-up on a llama with head_dim 64.

The built-in warm start (examples/addition/warm_start.py: hidden 128, 4 heads of 32) does not fit SGLang's CPU
attention, which needs head_dim 64. Measured on this 2-core box (400 supervised steps, batch 64, 200 held-out
prompts): hidden 128 with 2 heads of 64 reached 0.025 (lr 1e-3) and 0.065 (lr 3e-3), too little reward for RL to
work with; hidden 256 with 4 heads of 64 and 2 layers reached 0.245 at lr 1e-3 (and 0.025 after 200 steps at 2e-3).
So: hidden 256, 4 heads, 2 layers, lr 1e-3, trained exactly like the built-in warm start: up to its target accuracy
on a probe of training prompts (a fixed 400 steps gave 0.245 held-out on one CPU and 0.083 on another, and the
e2e test's RL margin failed from there; see examples/addition/warm_start.py)."""

from __future__ import annotations

from pathlib import Path

SFT_LR = 1e-3
HIDDEN = 256
LAYERS = 2
# This model jumps faster than the built-in one: checked every 20 steps it passed the target between steps 600 and
# 620 and landed at 0.543 held-out, where 20 RL steps gained only +5.7 points (the test's margin is +5). Checked
# every 5 steps, on a smaller probe to keep the checks' cost (~6 s) down, it stops nearer the target.
CHECK_EVERY = 5
PROBE = 128


def prepare_sglang_warm_start(model_dir: Path, seed: int = 0, lr: float = SFT_LR, hidden: int = HIDDEN,
                              layers: int = LAYERS) -> Path:
    """model_dir: a float32 safetensors llama (head_dim 64) trained on the training prompts to the built-in warm
    start's target, with the addition tokenizer. Cached by a marker file (written to a temporary folder, then
    renamed)."""
    import torch
    from transformers import LlamaForCausalLM

    from examples.addition.model import tiny_llama_config
    from examples.addition.tokenizer import save_tokenizer
    from examples.addition.warm_start import SFT_MAX_STEPS, SFT_TARGET, build_cached, supervised

    recipe = {"target": SFT_TARGET, "check_every": CHECK_EVERY, "probe": PROBE, "seed": seed, "lr": lr,
              "hidden": hidden, "heads": hidden // 64, "layers": layers}

    def build(tmp: Path) -> int:
        tok = save_tokenizer(tmp)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_llama_config(len(tok), hidden=hidden, layers=layers, heads=hidden // 64,
                                                   bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id))
        steps = supervised(model, tok, SFT_MAX_STEPS, seed, lr=lr, target=SFT_TARGET, check_every=CHECK_EVERY,
                           probe=PROBE)
        model.save_pretrained(str(tmp), safe_serialization=True)
        return steps

    return build_cached(Path(model_dir), recipe, build)
