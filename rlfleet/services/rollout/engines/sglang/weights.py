"""Weight plumbing for the SGLang engine: what the served model holds (names, shapes, dtypes, from the model folder),
an atomically written safetensors folder for /update_weights_from_disk, and read-back through /get_weights_by_name."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlfleet.services.rollout.engines.base import EngineError
from rlfleet.services.rollout.engines.sglang.client import SGLangClient
from rlfleet.weights.dtypes import SAFETENSORS_DTYPES


def held_specs(model_path: Path) -> dict[str, torch.Tensor]:
    """name -> meta tensor (shape, dtype) for every tensor of the folder's safetensors, plus lm_head.weight when the
    config ties it to the embedding (HF state_dict names, as TorchEngine.named_weights gives them)."""
    specs: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():                                          # noqa: SIM118 - safe_open API
                sl = st.get_slice(name)
                specs[name] = torch.empty(sl.get_shape(), dtype=SAFETENSORS_DTYPES[sl.get_dtype()], device="meta")
    if not specs:
        raise EngineError(f"no .safetensors tensors in {model_path}")
    config = json.loads((Path(model_path) / "config.json").read_text())
    embed = specs.get("model.embed_tokens.weight")
    if config.get("tie_word_embeddings") and embed is not None and "lm_head.weight" not in specs:
        specs["lm_head.weight"] = embed
    return specs


def _unshared(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share storage (tied embeddings): clone the repeats."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in named_tensors:
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def write_weights_folder(root: Path, version: int, named_tensors: list[tuple[str, torch.Tensor]],
                         config_from: Path) -> Path:
    """root/v{version}/{model.safetensors, config.json}, written in a temporary folder then renamed into place,
    so SGLang never sees a half-written file."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    tmp = root / f".v{version}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        save_file(_unshared(named_tensors), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy2(Path(config_from) / "config.json", tmp / "config.json")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def prune_weights_folders(root: Path, keep: Iterable[Path]) -> None:
    """Remove every version folder but `keep` (the one served, and the one SGLang rolls back to on a failed load)."""
    kept = {Path(p).resolve() for p in keep}
    for p in root.glob("v*"):
        if p.is_dir() and p.resolve() not in kept:
            shutil.rmtree(p, ignore_errors=True)


def read_back(client: SGLangClient, name: str, spec: torch.Tensor) -> torch.Tensor:
    """The tensor the server holds under an HF name (SGLang maps stacked qkv / gate_up itself), exact for float32,
    bfloat16 and float16 (SGLang sends float32 values; JSON keeps float32 exactly)."""
    values = client.get_weights_by_name(name, truncate_size=max(1, int(spec.shape[0]) if spec.dim() else 1))
    if values is None:
        raise EngineError(f"SGLang holds no parameter '{name}'")
    t = torch.tensor(values, dtype=torch.float32).to(spec.dtype)
    if tuple(t.shape) != tuple(spec.shape):
        raise EngineError(f"SGLang returned '{name}' with shape {tuple(t.shape)}, expected {tuple(spec.shape)}")
    return t
