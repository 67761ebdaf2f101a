"""The word-problem task of `bench/vs_trl.py --model smollm2`: the recipe's seeded problems (examples/word_problems:
a system line, three worked examples, the question) and one scorer both halves and the evaluation use.

Self-contained on purpose: the TRL half imports it under the TRL interpreter, which has no rlfleet dependencies."""

from __future__ import annotations

import random
import re

from examples.word_problems.make_data import problem

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def problems(count: int, seed: int) -> list[tuple[list[dict[str, str]], str]]:
    """`count` (chat messages, answer) pairs; the same seed gives the same problems in the same order."""
    rng = random.Random(seed)
    rows = [problem(rng) for _ in range(count)]
    return [(list(r["messages"]), str(r["answer"])) for r in rows]  # type: ignore[call-overload]


def score(text: str, want: str) -> float:
    """1.0 when the last number in the completion equals the answer (the stock `last_number` reward's rule)."""
    found = NUMBER.findall(text)
    return 1.0 if found and float(found[-1]) == float(want) else 0.0
