"""Megatron backend checkpoints, in the folder format of rlfleet/services/trainer/checkpoint.py (so `checkpoint.latest`,
`verify` and `prune` apply): each rank writes its model shards and AdamW state as safetensors
(`shard_rankNNNNN.safetensors`), its optimizer hyper-parameters as JSON and its RNG states; meta.json records the
parallel layout, which a resume must match."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.checkpoint import META, CheckpointError, CheckpointInfo

LAYOUT_KEYS = ("tensor_parallel", "pipeline_parallel", "data_parallel")
JSON_STATE = "json_state.json"


def _shard_file(folder: Path, rank: int) -> Path:
    return folder / f"shard_rank{rank:05d}.safetensors"


def _tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], Any]:
    """model.<name> and optim.<name>.<state key> tensors; the optimizer's param_groups (JSON-able)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {f"model.{n}": p.detach().cpu().contiguous() for n, p in model.named_parameters()}
    sd = optimizer.state_dict()
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    for index, state in sd["state"].items():
        for key, value in state.items():
            out[f"optim.{order[index]}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return out, sd["param_groups"]


def save(run_dir: Path, step: int, version: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         device: torch.device, keep: int, layout: dict[str, int], json_state: dict[str, Any] | None = None) -> Path:
    """Collective: every rank calls it. json_state: JSON-able states (e.g. the LR scheduler's), saved by rank 0.
    Returns the final checkpoint folder."""
    rank, world = dist.get_rank(), dist.get_world_size()
    final = checkpoint.step_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    tensors, groups = _tensors(model, optimizer)
    save_file(tensors, str(_shard_file(tmp, rank)))
    write_text_atomic(tmp / f"optim_groups_rank{rank:05d}.json", json.dumps(groups))
    checkpoint.write_rng_states(tmp, rank, device)
    dist.barrier()
    if rank == 0:
        meta = {"step": step, "version": version, "world_size": world, "torch": torch.__version__,
                "backend": "megatron", **layout}
        write_text_atomic(tmp / META, json.dumps(meta, indent=1))
        write_text_atomic(tmp / JSON_STATE, json.dumps(json_state or {}, indent=1))
        checkpoint.publish_folder(run_dir, tmp, final, keep)
    dist.barrier()
    return final


def load(info: CheckpointInfo, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
         layout: dict[str, int]) -> dict[str, Any]:
    """Collective: restore this rank's shards, AdamW state and RNG state (the layout must equal the saved one);
    returns the JSON states saved with it."""
    rank = dist.get_rank()
    ok, error = torch.ones(1, device=device), ""
    try:
        meta = json.loads((info.path / META).read_text())
        saved = {k: meta.get(k) for k in LAYOUT_KEYS}
        if meta.get("backend") != "megatron" or saved != layout:
            raise CheckpointError(f"checkpoint {info.path} holds backend {meta.get('backend', 'fsdp')} with layout "
                                  f"{saved}; this run is megatron with {layout}")
        if rank == 0:
            checkpoint.verify(info.path)
    except (CheckpointError, OSError, ValueError) as exc:
        ok.zero_()
        error = str(exc)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        raise CheckpointError(error or f"checkpoint {info.path} failed verification on another rank")
    tensors = load_file(str(_shard_file(info.path, rank)))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[f"model.{name}"])
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for index, name in enumerate(order):
        prefix = f"optim.{name}."
        entry = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if entry:
            state[index] = entry
    groups = json.loads((info.path / f"optim_groups_rank{rank:05d}.json").read_text())
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    checkpoint.restore_rng_states(info.path, rank, device)
    path = info.path / JSON_STATE
    return json.loads(path.read_text()) if path.exists() else {}
