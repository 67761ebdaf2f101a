"""Checks and loading for engine weight updates: names, shapes and dtypes are verified before anything is copied."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlfleet.services.rollout.engines.base import EngineError


def check_update(params: Mapping[str, torch.Tensor], named_tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Raise EngineError unless every tensor names a held parameter of the same shape and dtype."""
    for name, tensor in named_tensors:
        held = params.get(name)
        if held is None:
            raise EngineError(f"weight update names unknown tensor '{name}'")
        if tuple(held.shape) != tuple(tensor.shape):
            raise EngineError(f"weight update '{name}': shape {tuple(tensor.shape)}, engine holds {tuple(held.shape)}")
        if held.dtype != tensor.dtype:
            raise EngineError(f"weight update '{name}': dtype {tensor.dtype}, engine holds {held.dtype}")


def load_safetensors_folder(path: Path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of every *.safetensors file in a folder (or one file), in file then key order."""
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise EngineError(f"no .safetensors files in {path}")
    out: list[tuple[str, torch.Tensor]] = []
    for f in files:
        out.extend(load_file(str(f)).items())
    return out
