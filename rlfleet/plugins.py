"""Load user code by dotted path (`pkg.module:attr`) and check it against its contract at start-up.

The contract is the Protocol in rlfleet.protocols itself: what a plugin must accept is read from the Protocol's
`__call__` (or, for hooks, its methods), so changing a Protocol changes the check and nothing else has to follow.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, cast

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class PluginError(ValueError):
    """A plugin that cannot be imported or does not fit its contract."""


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


def contract_parameters(protocol: type, method: str = "__call__") -> list[inspect.Parameter]:
    """The parameters of protocol.method after self: what every implementation must accept."""
    return list(inspect.signature(getattr(protocol, method)).parameters.values())[1:]


def _parameter_text(p: inspect.Parameter) -> str:
    stars = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
    text = stars + p.name
    if p.annotation is not p.empty:      # annotations are strings here (from __future__ import annotations)
        text += f": {p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)}"
    if p.default is not p.empty:
        text += f"={p.default!r}"
    return text


def parameters_text(params: list[inspect.Parameter]) -> str:
    """`(a: int, *, key: str)`: parameters as they read in the source."""
    parts: list[str] = []
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and (i == 0 or params[i - 1].kind not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)):
            parts.append("*")
        parts.append(_parameter_text(p))
    return f"({', '.join(parts)})"


def contract_text(protocol: type, method: str = "__call__") -> str:
    """How the contract reads in an error, e.g. `RewardFn(prompt: Prompt, completion: str, sample: Sample)`."""
    where = protocol.__name__ if method == "__call__" else f"{protocol.__name__}.{method}"
    return where + parameters_text(contract_parameters(protocol, method))


def check_signature(fn: Callable[..., Any], protocol: type, what: str, path: str, method: str = "__call__",
                    columns_as_keywords: bool = False) -> None:
    """fn must accept a call the way the Protocol's method is called: its positional parameters positionally and
    its keyword-only ones by keyword. With columns_as_keywords (reward functions), fn's own further required
    parameters are a dataset's columns, passed by keyword. Builtins without a signature are trusted."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    wanted = contract_parameters(protocol, method)
    n = sum(1 for p in wanted if p.kind in _POSITIONAL)
    keywords = {p.name: None for p in wanted if p.kind is inspect.Parameter.KEYWORD_ONLY}
    if columns_as_keywords:
        params = list(sig.parameters.values())
        positional = [p for p in params if p.kind in _POSITIONAL]
        keywords |= {p.name: None for p in positional[n:] + [p for p in params
                                                            if p.kind is inspect.Parameter.KEYWORD_ONLY]
                     if p.default is inspect.Parameter.empty}
    try:
        sig.bind(*([None] * n), **keywords)
    except TypeError as exc:
        raise PluginError(f"{what} '{path}': signature {parameters_text(list(sig.parameters.values()))} does not "
                          f"fit {contract_text(protocol, method)} "
                          f"({exc})") from None


def load_callable(path: str, what: str, protocol: type) -> Callable[..., Any]:
    """Import `path` (for the config field `what`), check it is callable and fits `protocol`'s __call__."""
    obj = import_attr(path, what)
    if not callable(obj):
        raise PluginError(f"{what} '{path}': {type(obj).__name__} is not callable; expected "
                          f"{contract_text(protocol)}")
    check_signature(obj, protocol, what, path)
    return cast(Callable[..., Any], obj)


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
    """Each path names a class or zero-argument factory whose instance implements some TrainerHooks methods, each
    with the Protocol method's signature."""
    from rlfleet.protocols import HOOK_NAMES, TrainerHooks

    hooks = []
    for path in paths:
        obj = load_factory(path, "trainer.hooks", {})
        implemented = [name for name in HOOK_NAMES if callable(getattr(obj, name, None))]
        if not implemented:
            raise PluginError(f"trainer.hooks '{path}': implements none of {', '.join(HOOK_NAMES)} "
                              f"(the methods of TrainerHooks)")
        for name in implemented:
            check_signature(getattr(obj, name), TrainerHooks, "trainer.hooks", path, method=name)
        hooks.append(obj)
    return hooks
