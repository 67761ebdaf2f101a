"""A reward plugin that raises for the first sample of every fourth prompt (for failure tests)."""

from __future__ import annotations

from rlfleet.protocols import Prompt
from rlfleet.sample import Sample


def flaky_exact_match(prompt: Prompt, completion: str, sample: Sample) -> float:
    if prompt.index % 4 == 0 and sample.index == 0:
        raise ValueError(f"cannot score prompt {prompt.index}")
    return 1.0 if completion.strip() == prompt.label else 0.0
