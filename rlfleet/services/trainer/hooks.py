"""Calling user TrainerHooks: each hook object may implement any subset of rlfleet.protocols.HOOK_NAMES."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def call_hooks(hooks: Sequence[Any], name: str, *args: Any) -> None:
    for hook in hooks:
        fn = getattr(hook, name, None)
        if callable(fn):
            fn(*args)
