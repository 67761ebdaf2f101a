"""Plugins that the rollout integration test names in its config (a data source and a reward). No tests here."""

from __future__ import annotations

from rlfleet.protocols import Prompt
from rlfleet.sample import Sample


class SumPrompts:
    def __init__(self, size: int) -> None:
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> Prompt:
        a, b = index % 10, (3 * index) % 10
        return Prompt(index=index, text=f"{a}+{b}=", label=str(a + b))


def prompts(size: int = 100) -> SumPrompts:
    return SumPrompts(size)


def reward(prompt: Prompt, completion: str, sample: Sample) -> float:
    if prompt.index == 1:
        raise ValueError(f"prompt {prompt.index} is cursed")
    return 1.0 if completion.strip() == prompt.label else 0.0
