"""Dotted module paths with patterns: which modules of a model a spec's target names, and putting a module there."""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch

from rlfleet.plugins import PluginError


class ModelSpecError(PluginError):
    """A model spec that cannot be applied: a target that matches nothing, a replacement that does not import or does
    not fit its contract, or one whose state dict differs from the module it replaces."""


def resolve(model: torch.nn.Module, target: str, what: str) -> list[str]:
    """The dotted names of model's modules that target matches, in module order. Each part of target is matched
    against child names with fnmatch (`*` any one name, `[01]` a set); ModelSpecError naming the first part that
    matches nothing and what is there instead."""
    parts = target.split(".")
    if not target or any(not p for p in parts):
        raise ModelSpecError(f"{what}.target '{target}': expected a dotted module path like model.layers.*.mlp")
    found: list[tuple[str, torch.nn.Module]] = [("", model)]
    for i, part in enumerate(parts):
        matched = [(f"{prefix}.{name}" if prefix else name, child)
                   for prefix, module in found for name, child in module.named_children() if fnmatchcase(name, part)]
        if not matched:
            where = ".".join(parts[:i]) or f"the model ({type(model).__name__})"
            have = sorted({name for _, module in found for name, _ in module.named_children()})
            shown = ", ".join(have[:12]) + (", ..." if len(have) > 12 else "") if have else "no submodules"
            raise ModelSpecError(f"{what}.target '{target}': no module matches '{part}' under {where} "
                                 f"(it has: {shown})")
        found = matched
    return [path for path, _ in found]


def set_module(model: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    """Put module at dotted path (an explicit assignment on its parent, ModuleList indices included)."""
    model.set_submodule(path, module)
