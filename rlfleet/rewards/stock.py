"""Stock rewards, named in YAML (`rollout.reward_fn: last_number`, options in `rollout.reward_args`).

Each entry is a factory: options -> reward function (prompt, completion, sample, **extras) -> float.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from rlfleet.protocols import Prompt
from rlfleet.rewards.remote import remote

Reward = Callable[..., float]

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _label(prompt: Prompt, name: str) -> str:
    if prompt.label is None:
        raise ValueError(f"reward '{name}' needs a label: set label_field in the dataset config")
    return prompt.label


def exact_match(strip: bool = True, case_sensitive: bool = True) -> Reward:
    """1.0 when the completion equals the label (after strip; optionally ignoring case), else 0.0."""

    def norm(s: str) -> str:
        s = s.strip() if strip else s
        return s if case_sensitive else s.lower()

    def reward(prompt: Prompt, completion: str, sample: Any, **_: Any) -> float:
        return 1.0 if norm(completion) == norm(_label(prompt, "exact_match")) else 0.0

    return reward


def parse_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def last_number(tolerance: float = 1e-6, relative: bool = False) -> Reward:
    """1.0 when the last number in the completion equals the label's number within tolerance (absolute, or relative
    to |label| when relative is true), else 0.0. A completion without a number scores 0.0."""

    def reward(prompt: Prompt, completion: str, sample: Any, **_: Any) -> float:
        target = parse_number(_label(prompt, "last_number").strip())
        if target is None:
            raise ValueError(f"reward 'last_number': label {prompt.label!r} is not a number")
        found = NUMBER.findall(completion)
        value = parse_number(found[-1]) if found else None
        if value is None:
            return 0.0
        bound = tolerance * abs(target) if relative else tolerance
        return 1.0 if math.isclose(value, target, rel_tol=0.0, abs_tol=bound) else 0.0

    return reward


def regex(pattern: str, ignore_case: bool = False) -> Reward:
    """With a capture group: 1.0 when group 1 of the first match equals the label. Without: 1.0 when it matches."""
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    compiled = re.compile(pattern, flags)

    def reward(prompt: Prompt, completion: str, sample: Any, **_: Any) -> float:
        m = compiled.search(completion)
        if m is None:
            return 0.0
        if compiled.groups:
            return 1.0 if m.group(1).strip() == _label(prompt, "regex").strip() else 0.0
        return 1.0

    return reward


def format_reward(open_tag: str = "<think>", close_tag: str = "</think>", answer_required: bool = True) -> Reward:
    """1.0 when the completion is `open_tag ... close_tag` followed by an answer (non-empty unless
    answer_required is false), else 0.0."""
    compiled = re.compile(rf"^\s*{re.escape(open_tag)}.*?{re.escape(close_tag)}\s*(.*)$", re.DOTALL)

    def reward(prompt: Prompt, completion: str, sample: Any, **_: Any) -> float:
        m = compiled.match(completion)
        return 1.0 if m and (m.group(1).strip() or not answer_required) else 0.0

    return reward


def math_answer(float_rounding: int = 6) -> Reward:
    """1.0 when math-verify finds the completion's answer equal to the label (LaTeX, \\boxed{}, fractions...)."""
    from math_verify import parse, verify

    def reward(prompt: Prompt, completion: str, sample: Any, **_: Any) -> float:
        label = _label(prompt, "math")
        gold = parse(label if "$" in label or "\\" in label else f"${label}$", parsing_timeout=None)
        pred = parse(completion, parsing_timeout=None)
        return 1.0 if gold and pred and verify(gold, pred, float_rounding=float_rounding, timeout_seconds=None) \
            else 0.0

    return reward


def combined(**parts: dict[str, Any]) -> Callable[..., dict[str, float]]:
    """Named parts, each a stock reward with its options plus an optional `weight`; the reward is their weighted sum,
    e.g. reward_args: {format: {weight: 0.2}, last_number: {tolerance: 0.01}}."""
    fns: dict[str, tuple[Reward, float]] = {}
    for name, options in parts.items():
        opts = dict(options or {})
        weight = float(opts.pop("weight", 1.0))
        if name not in STOCK or name == "combined":
            raise ValueError(f"combined: unknown part '{name}' (stock rewards: {', '.join(sorted(STOCK))})")
        fns[name] = (STOCK[name](**opts), weight)

    def reward(prompt: Prompt, completion: str, sample: Any, **extras: Any) -> dict[str, float]:
        return {name: weight * fn(prompt, completion, sample, **extras) for name, (fn, weight) in fns.items()}

    return reward


STOCK: dict[str, Callable[..., Callable[..., Any]]] = {
    "exact_match": exact_match,
    "last_number": last_number,
    "regex": regex,
    "format": format_reward,
    "math": math_answer,
    "combined": combined,
    "remote": remote,
}

