"""Import a spec's replacement class and check it against rlfleet.protocols.ModuleReplacement at start-up."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from rlfleet.config.model_specs import ModuleSpecConfig
from rlfleet.model_specs.paths import ModelSpecError
from rlfleet.plugins import PluginError, import_attr, parameters_text
from rlfleet.protocols import ModuleReplacement

CONTRACT = "a torch.nn.Module class with a classmethod from_module(original: torch.nn.Module, path: str)"


@dataclass(frozen=True)
class ModuleSpec:
    """One loaded spec: its target pattern, the dotted path of its class, and the class."""

    target: str
    replace: str
    cls: type[torch.nn.Module]

    def build(self, original: torch.nn.Module, path: str) -> torch.nn.Module:
        return self.cls.from_module(original, path)          # checked by load_spec


def _contract_arity() -> int:
    """How many positional arguments ModuleReplacement.from_module takes (after cls): read from the Protocol."""
    return len(inspect.signature(ModuleReplacement.from_module).parameters)


def load_spec(entry: ModuleSpecConfig, what: str) -> ModuleSpec:
    """Import entry.replace; ModelSpecError naming what and the path unless it is CONTRACT."""
    try:
        obj = import_attr(entry.replace, f"{what}.replace")
    except PluginError as exc:
        raise ModelSpecError(str(exc)) from None
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise ModelSpecError(f"{what}.replace '{entry.replace}': {type(obj).__name__} {obj!r:.60} is not a "
                             f"torch.nn.Module class; expected {CONTRACT}")
    factory = inspect.getattr_static(obj, "from_module", None)
    if not isinstance(factory, classmethod | staticmethod):
        raise ModelSpecError(f"{what}.replace '{entry.replace}': {obj.__name__} has no classmethod from_module; "
                             f"expected {CONTRACT}")
    bound = obj.from_module                                  # type: ignore[attr-defined]
    try:
        inspect.signature(bound).bind(*([None] * _contract_arity()))
    except TypeError as exc:
        raise ModelSpecError(f"{what}.replace '{entry.replace}': from_module"
                             f"{parameters_text(list(inspect.signature(bound).parameters.values()))} does not fit "
                             f"from_module(original: torch.nn.Module, path: str) ({exc})") from None
    return ModuleSpec(entry.target, entry.replace, obj)


def load_specs(entries: list[ModuleSpecConfig]) -> list[ModuleSpec]:
    """model.specs, imported and checked, in order."""
    return [load_spec(entry, f"model.specs[{i}]") for i, entry in enumerate(entries)]
