"""Reward: 1 for the right final answer (the text after the last tool result), plus 0.1 for using the tool."""

from __future__ import annotations

from rlfleet.protocols import Prompt
from rlfleet.sample import Sample


def final_answer(completion: str) -> str:
    return completion.rsplit("</result>", 1)[-1].strip()


def solved(prompt: Prompt, completion: str, sample: Sample) -> dict[str, float]:
    """completion: the whole decoded response (model and tool turns, special tokens removed)."""
    used_tool = "<calc>" in completion and "<result>" in completion
    return {"correct": float(final_answer(completion) == prompt.label), "tool_use": 0.1 if used_tool else 0.0}
