"""Load user code by dotted path (`pkg.module:attr`) and check it against its contract at start-up."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any


class PluginError(ValueError):
    """A plugin that cannot be imported or does not fit its contract."""


# contract name -> number of positional arguments the callable must accept
ARITY: dict[str, int] = {
    "reward_fn": 3,        # (prompt, completion, sample)
    "rollout_fn": 3,       # (ctx, prompt, ticket)
    "sample_filter": 1,    # (group)
    "advantage": 1,        # (batch)
    "loss": 4,             # (logprobs, advantages, batch, token_count)
}


def import_attr(path: str, what: str) -> Any:
    if ":" not in path:
        raise PluginError(f"{what} '{path}': expected 'package.module:attribute'")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise PluginError(f"{what} '{path}': module '{module_name}' could not be imported: "
                          f"{type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{what} '{path}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def check_arity(fn: Callable[..., Any], n: int, what: str, path: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(*([None] * n))
    except TypeError as exc:
        raise PluginError(f"{what} '{path}': signature {sig} does not accept {n} positional arguments "
                          f"({exc})") from exc


def load_callable(path: str, what: str, arity: int | None = None) -> Callable[..., Any]:
    """Import `path`, check it is callable and accepts `arity` positional args (default: ARITY[what])."""
    obj = import_attr(path, what)
    if not callable(obj):
        raise PluginError(f"{what} '{path}': {type(obj).__name__} is not callable")
    n = ARITY.get(what) if arity is None else arity
    if n is not None:
        check_arity(obj, n, what, path)
    return obj


def load_factory(path: str, what: str, kwargs: dict[str, Any]) -> Any:
    """Import a factory and call it with kwargs; a bad keyword is reported with the factory's signature."""
    factory = import_attr(path, what)
    if not callable(factory):
        raise PluginError(f"{what} '{path}': {type(factory).__name__} is not callable")
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise PluginError(f"{what} '{path}': arguments {sorted(kwargs)} do not fit {inspect.signature(factory)}: "
                          f"{exc}") from exc
    except ValueError:
        pass
    return factory(**kwargs)


def load_hooks(paths: list[str]) -> list[Any]:
    """Each path names a class or zero-argument factory whose instance implements some TrainerHooks methods."""
    from rlfleet.protocols import HOOK_NAMES

    hooks = []
    for path in paths:
        obj = load_factory(path, "hook", {})
        if not any(callable(getattr(obj, name, None)) for name in HOOK_NAMES):
            raise PluginError(f"hook '{path}': implements none of {', '.join(HOOK_NAMES)}")
        hooks.append(obj)
    return hooks
