"""`rlfleet convert RUN_DIR/checkpoints/step_N OUT_DIR` (it runs `python -m rlfleet.services.trainer.export`): the
policy
of a trainer checkpoint as an HF folder (model.safetensors + the config and tokenizer files), loadable with
AutoModelForCausalLM.from_pretrained.

Reads the sharded torch-DCP state in one process (whatever number of ranks wrote it), takes the model's tensors,
merges LoRA adapters into their base weights (W + alpha/r * B @ A) when the checkpoint has them, and copies the
config/tokenizer files the checkpoint keeps in hf/ (or, for older checkpoints, those of meta.json's model_path).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.security.safe_unpickle import SafeFileSystemReader, SafeLoadPlanner
from rlfleet.services.trainer.checkpoint import META, STATE
from rlfleet.services.trainer.lora import merge_adapters
from rlfleet.weights.dtypes import DTYPES

MODEL_PREFIX = "model."


class ConvertError(RuntimeError):
    """Not a complete trainer checkpoint, or nothing to convert."""


def read_policy_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """Full (unsharded) policy tensors of a trainer checkpoint, by HF state-dict name, on CPU."""
    state_dir = ckpt / STATE
    if not (ckpt / META).is_file() or not state_dir.is_dir():
        raise ConvertError(f"{ckpt} is not a trainer checkpoint ({META} and {STATE}/ expected)")
    metadata = SafeFileSystemReader(str(state_dir)).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, entry in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(entry, TensorStorageMetadata):
            model[key[len(MODEL_PREFIX):]] = torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
    if not model:
        raise ConvertError(f"{ckpt} holds no model tensors")
    state = {"model": model}
    dcp.load(state, storage_reader=SafeFileSystemReader(str(state_dir)), planner=SafeLoadPlanner(), no_dist=True)
    return state["model"]


def merge_lora(state: dict[str, torch.Tensor], lora: dict | None) -> dict[str, torch.Tensor]:
    if not lora:
        return state
    return merge_adapters(state, float(lora["alpha"]) / int(lora["rank"]))


def _side_files(ckpt: Path, meta: dict) -> list[Path]:
    hf = ckpt / "hf"
    if hf.is_dir():
        return sorted(p for p in hf.iterdir() if p.is_file())
    model_path = Path(meta.get("model_path", ""))
    if meta.get("model_path") and model_path.is_dir():
        return sorted(p for p in model_path.iterdir()
                      if p.is_file() and p.suffix not in (".safetensors", ".bin", ".pt", ".pth"))
    raise ConvertError(f"{ckpt} keeps no hf/ config files and meta.json names no model folder")


def convert(ckpt: Path | str, out_dir: Path | str, dtype: str | None = None) -> Path:
    """Write the HF folder; returns out_dir. dtype: cast floating tensors (default: as trained, fp32 masters)."""
    ckpt, out = Path(ckpt), Path(out_dir)
    meta = json.loads((ckpt / META).read_text()) if (ckpt / META).is_file() else {}
    state = merge_lora(read_policy_state(ckpt), meta.get("lora"))
    files = _side_files(ckpt, meta)
    config = {}
    for f in files:
        if f.name == "config.json":
            config = json.loads(f.read_text())
    if config.get("tie_word_embeddings") and "lm_head.weight" in state:
        state.pop("lm_head.weight")                  # tied: HF re-ties it to the input embedding on load
    if dtype:
        state = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in state.items()}
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for f in files:
        if f.name.endswith(".safetensors") or f.name == "model.safetensors.index.json":
            continue
        shutil.copyfile(f, tmp / f.name)
    if config and dtype:
        config["dtype"] = dtype
        write_text_atomic(tmp / "config.json", json.dumps(config, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m rlfleet.services.trainer.export CHECKPOINT OUT_DIR [--dtype D]`: what `rlfleet convert` runs."""
    parser = argparse.ArgumentParser(prog="rlfleet convert")
    parser.add_argument("checkpoint")
    parser.add_argument("out_dir")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    ns = parser.parse_args(argv)
    try:
        print(convert(ns.checkpoint, ns.out_dir, ns.dtype))
        return 0
    except (ConvertError, OSError) as exc:
        print(f"rlfleet convert: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
