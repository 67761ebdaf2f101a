"""Exact-match reward: 1.0 when the completion is the sum, else 0.0."""

from __future__ import annotations

from rlfleet.protocols import Prompt
from rlfleet.sample import Sample


def exact_match(prompt: Prompt, completion: str, sample: Sample) -> float:
    return 1.0 if completion.strip() == prompt.label else 0.0
