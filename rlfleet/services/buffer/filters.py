"""Group filters: built-in ones by name, user SampleFilters by dotted path (rlfleet.plugins).

A filter looks at one complete group (its kept samples) and returns None to keep it or the reason to drop it.
Built-in filters read only `reward`, so they get the buffer's stored entries and nothing is decoded; user filters
get rlfleet.sample.Sample objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet.plugins import load_callable
from rlfleet.protocols import SampleFilter


def dynamic_sampling(group: Sequence[Any]) -> str | None:
    """DAPO dynamic sampling: a group whose rewards are all equal has zero advantage everywhere; drop it."""
    rewards = {float(s.reward) for s in group}
    return f"all {len(group)} rewards equal {rewards.pop()}" if len(rewards) == 1 else None


BUILTIN: dict[str, Callable[[Sequence[Any]], str | None]] = {"dynamic_sampling": dynamic_sampling}


@dataclass(frozen=True)
class GroupFilter:
    name: str
    fn: Callable[[Sequence[Any]], str | None]
    needs_samples: bool          # True: give it decoded rlfleet.sample.Sample objects


def load_filters(specs: Sequence[str]) -> list[GroupFilter]:
    """Resolve `buffer.filters`: built-in names or `package.module:attr` paths (checked now, not at first use)."""
    out = []
    for spec in specs:
        if spec in BUILTIN:
            out.append(GroupFilter(spec, BUILTIN[spec], needs_samples=False))
        else:
            out.append(GroupFilter(spec, load_callable(spec, "buffer.filters", SampleFilter), needs_samples=True))
    return out
