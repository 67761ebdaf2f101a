"""Arithmetic questions for the calculator agent ("37*58" -> "2146"), with a fixed held-out split."""

from __future__ import annotations

import random

from rlfleet.protocols import Prompt

_ALL = [(a, op, b) for a in range(10, 100) for b in range(10, 100) for op in "*+"]


def _split(heldout: int, seed: int) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    items = list(_ALL)
    random.Random(seed).shuffle(items)
    return items[heldout:], items[:heldout]


def answer(a: int, op: str, b: int) -> int:
    return a * b if op == "*" else a + b


class CalculatorPrompts:
    """An indexable data source of one-message chats; indices past the end wrap around (same order each epoch)."""

    def __init__(self, items: list[tuple[int, str, int]]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> Prompt:
        a, op, b = self._items[index % len(self._items)]
        return Prompt(index=index, messages=({"role": "user", "content": f"{a}{op}{b}"},),
                      label=str(answer(a, op, b)))


def train_prompts(seed: int = 0, heldout: int = 500) -> CalculatorPrompts:
    return CalculatorPrompts(_split(heldout, seed)[0])


def heldout_prompts(seed: int = 0, heldout: int = 500) -> CalculatorPrompts:
    return CalculatorPrompts(_split(heldout, seed)[1])
