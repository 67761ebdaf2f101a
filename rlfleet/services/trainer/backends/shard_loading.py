"""Models larger than one device: build the model on the meta device, shard it with FSDP2, then read from the
safetensors files only the rows each rank holds. A rank's peak memory while loading is its shard plus one
tensor's shard being read, never the whole model (the old path loaded the full fp32 model on every rank).

FSDP2 shards every parameter on dim 0 in torch.chunk layout: rank r of W holds rows [r*c, min((r+1)*c, n)) with
c = ceil(n / W). Non-persistent buffers (rotary inv_freq) are not in the files: their modules are rebuilt from the
model config on the target device and the buffers copied over.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open


class ShardLoadError(RuntimeError):
    """The model folder cannot be loaded shard by shard (a missing tensor, or a module it cannot rebuild)."""


def weight_files(model_path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (single file or a sharded index)."""
    index = model_path / "model.safetensors.index.json"
    if index.exists():
        return {name: model_path / f for name, f in json.loads(index.read_text())["weight_map"].items()}
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise ShardLoadError(f"{model_path} has no safetensors files")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            out.update({k: f for k in sf.keys()})  # noqa: SIM118 - safe_open has no __iter__
    return out


def files_name_every_parameter(model: torch.nn.Module, model_path: Path) -> bool:
    """Whether the checkpoint stores each parameter under the module's own name. Not so where transformers
    converts at load time (e.g. per-expert MoE weights fused into one tensor): those load whole, by from_pretrained."""
    try:
        names = set(weight_files(model_path))
    except ShardLoadError:
        return False
    return all(n in names for n, _ in model.named_parameters())


def _row_range(n: int, rank: int, world: int) -> tuple[int, int]:
    chunk = math.ceil(n / world) if n else 0
    return min(rank * chunk, n), min((rank + 1) * chunk, n)


def build_meta_model(model_path: Path, **kwargs: Any) -> torch.nn.Module:
    """The architecture of model_path with every parameter and buffer on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, **kwargs)


def load_shards(model: torch.nn.Module, model_path: Path, rank: int, world: int, device: torch.device) -> int:
    """Materialise a model sharded by FSDP2 on the meta device: allocate this rank's shards on `device`, fill them
    from the files, rebuild non-persistent buffers. Returns the bytes this rank read."""
    from torch.distributed.tensor import DTensor

    files = weight_files(model_path)
    model.to_empty(device=device)
    read = 0
    handles: dict[Path, Any] = {}
    try:
        with torch.no_grad():
            for name, param in model.named_parameters():
                key = name if name in files else name.removeprefix("_orig_mod.")
                if key not in files:
                    raise ShardLoadError(f"{model_path}: no tensor '{key}' in its safetensors files")
                f = files[key]
                sf = handles.get(f) or handles.setdefault(f, safe_open(str(f), framework="pt"))
                slice_ = sf.get_slice(key)
                local = param.to_local() if isinstance(param, DTensor) else param
                if isinstance(param, DTensor):
                    lo, hi = _row_range(slice_.get_shape()[0], rank, world)
                    part = slice_[lo:hi] if hi > lo else torch.empty(local.shape)
                else:
                    part = slice_[:]
                if tuple(part.shape) != tuple(local.shape):
                    raise ShardLoadError(f"{key}: file rows {tuple(part.shape)} do not fit this rank's shard "
                                         f"{tuple(local.shape)}")
                local.copy_(part.to(local.dtype))
                read += part.numel() * part.element_size()
    finally:
        handles.clear()
    _rebuild_buffers(model, device)
    return read


def _rebuild_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Modules with non-persistent buffers (not in any checkpoint) are rebuilt from the config on `device`."""
    config = getattr(model, "config", None)
    for mod_name, module in model.named_modules():
        persistent = set(module.state_dict(keep_vars=True))
        transient = [b for b, _ in module.named_buffers(recurse=False) if b not in persistent]
        if not transient:
            continue
        fresh = _rebuilt(type(module), config, device, mod_name)
        for b in transient:
            setattr(module, b, getattr(fresh, b).to(device))


def _rebuilt(cls: type, config: Any, device: torch.device, name: str) -> torch.nn.Module:
    makers: list[Callable[[], torch.nn.Module]] = [lambda: cls(config=config, device=device),
                                                   lambda: cls(config=config)]
    for make in makers:
        try:
            return make()
        except TypeError:
            continue
    raise ShardLoadError(f"cannot rebuild module {name} ({cls.__name__}) to restore its non-persistent buffers")
