"""The one held-out evaluation bench/vs_trl.py applies to both trained models: greedy decoding with HF `generate`
from an HF folder, scored with the task's reward, so neither framework's own evaluation is trusted."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@torch.no_grad()
def greedy_pass_rate(model_dir: Path, prompts: list, labels: list[str], score, max_new_tokens: int,  # noqa: ANN001
                     chat: bool = False, batch: int = 100, device: str = "cpu") -> float:
    """Mean score of greedy completions. prompts: text, or chat messages when chat (chat template applied)."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    total = 0.0
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo:lo + batch]
        if chat:
            texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chunk]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        else:
            enc = tok(chunk, return_tensors="pt", padding=True)
        enc = {k: v.to(device) for k, v in enc.items()}
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)                    # [B, P + N]
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        total += sum(score(t, want) for t, want in zip(texts, labels[lo:lo + batch], strict=True))
    return total / max(len(prompts), 1)
