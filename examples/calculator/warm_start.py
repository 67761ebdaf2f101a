"""A short supervised warm start: the tiny model learns the tool-call format, so RL starts above zero reward.

Training conversations are built with the same TitoSession the agent uses (the model's turns as "engine output",
the tool's as environment messages) and the loss is taken on the model tokens only (loss mask 1).
`prepare(model_dir, seed)` writes the folder once (temporary folder, then rename; a marker file caches it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from examples.addition.model import tiny_llama_config
from examples.calculator.data import train_prompts
from examples.calculator.tokenizer import save_tokenizer
from examples.calculator.tool import calculate
from rlfleet.protocols import Generation, Prompt
from rlfleet.services.rollout.tito import TitoSession

SFT_STEPS = 150
SFT_BATCH = 32
SFT_LR = 3e-3
HIDDEN, LAYERS = 64, 2     # ~0.1M parameters: cheap on a shared CPU


def _turn(tok: Any, text: str) -> Generation:
    ids = tuple(tok.encode(text, add_special_tokens=False))
    return Generation(output_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop", weight_version=0)


def conversation(tok: Any, prompt: Prompt) -> tuple[list[int], list[int]]:
    """(input ids [L], loss mask [L]) of the ideal episode: call the tool on the question, then answer."""
    if not prompt.messages:
        raise ValueError(f"calculator prompt {prompt.text!r} has no messages")
    question = prompt.messages[0]["content"]
    session = TitoSession(tok, prompt.messages)
    session.add_generation(_turn(tok, f"<calc>{question}</calc>"))
    session.add_messages([{"role": "tool", "content": f"<result>{calculate(question)}</result>"}])
    session.add_generation(_turn(tok, f"{prompt.label}{tok.eos_token}"))
    return session.input_ids, [0] * len(session.prompt_ids) + session.loss_mask


def supervised(model: LlamaForCausalLM, tok: Any, steps: int, seed: int, batch: int = SFT_BATCH,
               lr: float = SFT_LR) -> None:
    data = train_prompts(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        rows = [conversation(tok, data[step * batch + i]) for i in range(batch)]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((batch, width), tok.pad_token_id)        # [B, L]
        labels = torch.full((batch, width), -100)                        # [B, L]
        for r, (ids, mask) in enumerate(rows):
            input_ids[r, :len(ids)] = torch.tensor(ids)
            labels[r, :len(ids)] = torch.where(torch.tensor(mask) > 0, torch.tensor(ids), -100)
        loss = model(input_ids=input_ids, attention_mask=(input_ids != tok.pad_token_id).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def prepare(model_dir: str, seed: int = 0, steps: int = SFT_STEPS) -> None:
    """Build model_dir once: a random tiny llama with the calculator tokenizer, then `steps` supervised steps."""
    path = Path(model_dir)
    marker = path / "warm_start.json"
    if marker.exists() and json.loads(marker.read_text()).get("steps") == steps:
        return
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = save_tokenizer(tmp)
    tok = AutoTokenizer.from_pretrained(str(tmp))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tok), hidden=HIDDEN, layers=LAYERS, bos=tok.eos_token_id,
                                               eos=tok.eos_token_id, pad=tok.pad_token_id))
    supervised(model, tok, steps, seed)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "warm_start.json").write_text(json.dumps({"steps": steps, "seed": seed}))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
