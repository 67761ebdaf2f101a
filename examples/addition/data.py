"""Two-digit addition prompts ("12+34=" -> "46"), with a fixed held-out split."""

from __future__ import annotations

import random

from rlfleet.protocols import Prompt

_ALL = [(a, b) for a in range(100) for b in range(100)]


def _split(heldout: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = list(_ALL)
    random.Random(seed).shuffle(pairs)
    return pairs[heldout:], pairs[:heldout]


class AdditionPrompts:
    """An indexable data source; indices past the end wrap around in a new shuffled order per epoch."""

    def __init__(self, pairs: list[tuple[int, int]], seed: int) -> None:
        self._pairs = pairs
        self._seed = seed
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._pairs)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self._pairs)))
            random.Random(self._seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    def __getitem__(self, index: int) -> Prompt:
        epoch, pos = divmod(index, len(self._pairs))
        a, b = self._pairs[self._order(epoch)[pos]]
        return Prompt(index=index, text=f"{a}+{b}=", label=str(a + b))


def train_prompts(seed: int = 0, heldout: int = 500) -> AdditionPrompts:
    return AdditionPrompts(_split(heldout, seed)[0], seed)


def heldout_prompts(seed: int = 0, heldout: int = 500) -> AdditionPrompts:
    return AdditionPrompts(_split(heldout, seed)[1], seed)
