"""model.router_scores: R3's router score functions named in the config, checked against
rlfleet.protocols.RouterScoreFn and added to the built-in ones (rlfleet/services/trainer/routing_replay.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlfleet.plugins import load_callable
from rlfleet.protocols import RouterScoreFn


def load_router_scores(entries: Mapping[str, str]) -> dict[str, Callable[..., Any]]:
    """Router class name -> its score function, each imported and checked; PluginError naming the entry otherwise."""
    return {name: load_callable(path, f"model.router_scores.{name}", RouterScoreFn) for name, path in entries.items()}
