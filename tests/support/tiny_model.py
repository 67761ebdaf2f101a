"""A tiny random llama with the addition recipe's character tokenizer, for tests."""

from __future__ import annotations

from pathlib import Path

from examples.addition.model import build_random_model


def make_tiny_model(path: Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Write a ~30k-parameter llama (vocab 19, head_dim 8) with its tokenizer to path; return path."""
    build_random_model(Path(path), seed=seed, hidden=hidden, layers=layers)
    return Path(path)
