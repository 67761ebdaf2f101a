"""The TRL half of bench/vs_trl.py, run by the TRL interpreter (a venv with trl; see bench/vs_trl.py).

TRL's GRPOTrainer on the same task as the rlfleet half: the same warm-start folder, the same training prompts in
the same order (shuffle off), the same exact-match reward, group size, prompts per step, new tokens, temperature,
lr, grad clip, constant schedule, beta 0, token-level (dapo) loss, group-scaled rewards, one update per batch.
Writes the trained model to --out and one JSON line {"wall_s", "train_s", "samples", "steps"} to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _addition_rows(count: int, seed: int) -> list[dict[str, str | None]]:
    from examples.addition.data import train_prompts

    source = train_prompts(seed=seed)
    return [{"prompt": source[i].text, "label": source[i].label} for i in range(count)]


def _smollm2_rows(count: int, seed: int) -> list[dict]:
    from bench.vs_trl_parts.word_problems import problems

    return [{"prompt": messages, "label": answer} for messages, answer in problems(count, seed)]


def exact_match(completions: list, label: list[str], **_: object) -> list[float]:
    out = []
    for c, want in zip(completions, label, strict=True):
        text = c[-1]["content"] if isinstance(c, list) else c
        out.append(1.0 if text.strip() == want else 0.0)
    return out


def last_number(completions: list, label: list[str], **_: object) -> list[float]:
    from bench.vs_trl_parts.word_problems import score

    return [score(c[-1]["content"] if isinstance(c, list) else c, want) for c, want in zip(completions, label,
                                                                                          strict=True)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--task", choices=["addition", "smollm2"], default="addition")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: the CPUs this process may use)")
    p.add_argument("--gpu", action="store_true", help="CUDA, bf16")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision on CPU too (TRL's bf16=True)")
    a = p.parse_args()
    started = time.monotonic()
    import os

    import torch
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = (_addition_rows if a.task == "addition" else _smollm2_rows)(a.steps * a.groups, a.seed)
    cfg = GRPOConfig(
        output_dir=str(Path(a.out) / "trl_run"), per_device_train_batch_size=a.groups * a.group_size,
        num_generations=a.group_size, max_completion_length=a.new_tokens, temperature=a.temperature,
        learning_rate=a.lr, max_grad_norm=1.0, beta=0.0, loss_type="dapo", scale_rewards="group",
        shuffle_dataset=False, num_iterations=1, gradient_accumulation_steps=1, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_steps=a.steps, logging_steps=max(1, a.steps // 5), report_to="none",
        save_strategy="no", gradient_checkpointing=False, use_cpu=not a.gpu, bf16=a.gpu or a.bf16, seed=a.seed,
        dataloader_num_workers=0, disable_dropout=True)
    trainer = GRPOTrainer(model=a.model_dir, reward_funcs=exact_match if a.task == "addition" else last_number,
                          args=cfg, train_dataset=Dataset.from_list(rows))
    t0 = time.monotonic()
    step_times: list[float] = []

    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            now = time.monotonic()
            step_times.append(now - self.last)
            self.last = now

    trainer.add_callback(StepClock())
    trainer.train()
    train_s = time.monotonic() - t0
    trainer.model.save_pretrained(a.out)
    trainer.processing_class.save_pretrained(a.out)
    print(json.dumps({"wall_s": time.monotonic() - started, "train_s": train_s, "steps": a.steps,
                      "samples": a.steps * a.groups * a.group_size, "step_s": step_times}))


if __name__ == "__main__":
    main()
