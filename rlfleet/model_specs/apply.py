"""Apply loaded model specs to a model: each matched module is replaced by its spec's from_module(original, path), an
explicit assignment on the parent, checked to keep the original's state-dict names and shapes, and recorded."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet.model_specs.loading import ModuleSpec
from rlfleet.model_specs.paths import ModelSpecError, resolve, set_module

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedSpec:
    """What one spec replaced: its target, its class's dotted path, and the module paths it replaced."""

    target: str
    replace: str
    paths: tuple[str, ...]


def _state_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in module.state_dict().items()}


def check_same_state(original: torch.nn.Module, replacement: torch.nn.Module, what: str, path: str) -> None:
    """The replacement must hold the original's state-dict names and shapes (checkpoints, publishing and the engine's
    weight loads go by name); ModelSpecError listing the differences otherwise."""
    before, after = _state_shapes(original), _state_shapes(replacement)
    if before == after:
        return
    missing = sorted(set(before) - set(after))
    extra = sorted(set(after) - set(before))
    reshaped = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = [f"{label} {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}"
             for label, names in (("missing", missing), ("extra", extra), ("reshaped", reshaped)) if names]
    raise ModelSpecError(f"{what}: the replacement of {path} must keep its state dict (names and shapes; "
                         f"checkpoints and weight loads go by name): {'; '.join(parts)}")


def apply_specs(model: torch.nn.Module, specs: Sequence[ModuleSpec]) -> list[AppliedSpec]:
    """Replace, spec by spec in order, every module its target matches (a later spec sees the earlier ones'
    replacements). Returns what was replaced; ModelSpecError naming the spec and the module path on any failure."""
    applied = []
    for i, spec in enumerate(specs):
        what = f"model.specs[{i}] ({spec.replace})"
        paths = resolve(model, spec.target, f"model.specs[{i}]")
        for path in paths:
            original = model.get_submodule(path)
            try:
                replacement = spec.build(original, path)
            except Exception as exc:  # noqa: BLE001 - the user's from_module: reported with the path it failed on
                raise ModelSpecError(f"{what}: from_module failed on {path} ({type(original).__name__}): "
                                     f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(replacement, torch.nn.Module):
                raise ModelSpecError(f"{what}: from_module returned {type(replacement).__name__} for {path}, not a "
                                     f"torch.nn.Module")
            check_same_state(original, replacement, what, path)
            set_module(model, path, replacement)
        applied.append(AppliedSpec(spec.target, spec.replace, tuple(paths)))
        log.info("model.specs[%d]: %s replaced %d module(s) at %s", i, spec.replace, len(paths), spec.target)
    return applied
