"""A short supervised warm start so that RL starts from rewards above zero.

`prepare(model_dir, seed)` builds the tiny model and trains it on a few thousand addition examples;
the result is cached in model_dir (written to a temporary folder, then renamed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer

from examples.addition.data import heldout_prompts, train_prompts
from examples.addition.model import build_random_model

SFT_STEPS = 400
SFT_BATCH = 64
SFT_LR = 1e-3


def _encode(tok, prompts: list) -> list[tuple[list[int], int]]:
    """(prompt + answer + eos ids, where the answer starts) per prompt: the same ids as `tok.encode` of each text,
    from one batched call of the Rust tokenizer per field (25,600 rows: ~0.2 s, against ~2.8 s one at a time)."""
    fast = tok.backend_tokenizer
    texts = fast.encode_batch_fast([p.text or "" for p in prompts])
    answers = fast.encode_batch_fast([p.label or "" for p in prompts], add_special_tokens=False)
    return [(t.ids + a.ids + [tok.eos_token_id], len(t.ids)) for t, a in zip(texts, answers, strict=True)]


def supervised(model, tok, steps: int, seed: int, batch: int = SFT_BATCH, lr: float = SFT_LR) -> None:
    """Next-token loss on the answer tokens of `steps` batches of training prompts."""
    data = train_prompts(seed=seed)
    encoded = _encode(tok, [data[i] for i in range(steps * batch)])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        rows = encoded[step * batch: (step + 1) * batch]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((batch, width), tok.pad_token_id)      # [B, L]
        labels = torch.full((batch, width), -100)                      # [B, L]
        for r, (ids, start) in enumerate(rows):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            labels[r, start: len(ids)] = torch.tensor(ids[start:])
        loss = model(input_ids=input_ids, attention_mask=(input_ids != tok.pad_token_id).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@torch.no_grad()
def greedy_accuracy(model, tok, n: int = 200, seed: int = 0) -> float:
    data = heldout_prompts(seed=seed)
    correct = 0
    for i in range(min(n, len(data))):
        p = data[i]
        ids = torch.tensor([tok.encode(p.text)])
        out = model.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        correct += text.strip() == p.label
    return correct / min(n, len(data))


def prepare(model_dir: str, seed: int = 0, steps: int = SFT_STEPS) -> None:
    """Build model_dir once: a random tiny llama, then `steps` supervised steps. Cached by a marker file."""
    path = Path(model_dir)
    marker = path / "warm_start.json"
    if marker.exists() and json.loads(marker.read_text()).get("steps") == steps:
        return
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    model = build_random_model(tmp, seed=seed)
    tok = AutoTokenizer.from_pretrained(str(tmp))
    supervised(model, tok, steps, seed)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "warm_start.json").write_text(json.dumps({"steps": steps, "seed": seed}))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)

