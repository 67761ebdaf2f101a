"""FSDP2 backend: torch.distributed (gloo on CPU, NCCL on CUDA), HF causal LM sharded per decoder layer, AdamW."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlfleet.config import Config
from rlfleet.sample import Sample
from services.trainer.hooks import call_hooks
from services.trainer.step import StepContext, train_step
from services.weight_sync.manifest import DTYPES

log = logging.getLogger(__name__)

# Rank 0 may wait for a batch (rollout) while the others sit in the broadcast: collectives wait this long.
COLLECTIVE_TIMEOUT = timedelta(hours=2)


def trainer_device(device: str, rank: int) -> torch.device:
    """cpu, or the CUDA device of this rank (LOCAL_RANK, else rank modulo the visible devices)."""
    if not device.startswith("cuda"):
        return torch.device("cpu")
    if ":" in device:
        return torch.device(device)
    local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
    return torch.device("cuda", local)


def init_distributed(rendezvous: str, rank: int, world_size: int, device: torch.device) -> None:
    """Join the trainer's process group: tcp://rendezvous (MASTER_ADDR:MASTER_PORT env when empty)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not rendezvous and "MASTER_ADDR" in os.environ:
        rendezvous = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}"
    if world_size == 1 and not rendezvous:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=COLLECTIVE_TIMEOUT)
        return
    if not rendezvous:
        raise ValueError(f"trainer.world_size={world_size} needs endpoints.rendezvous (host:port)")
    dist.init_process_group(backend, init_method=f"tcp://{rendezvous}", rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: HF's _no_split_modules classes, else children of a 'layers' list."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    return []


class FsdpBackend:
    """One trainer rank's model and optimizer. Construct on every rank after init_distributed."""

    def __init__(self, cfg: Config, rank: int, world_size: int, device: torch.device,
                 hooks: Sequence[Any] = ()) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.publish_dtype = DTYPES[cfg.model.dtype]
        model = AutoModelForCausalLM.from_pretrained(str(cfg.model_path), dtype=torch.float32)
        model.to(device)
        call_hooks(hooks, "after_model_init", model)
        mesh = init_device_mesh(device.type, (world_size,))
        mp = MixedPrecisionPolicy() if self.publish_dtype == torch.float32 else \
            MixedPrecisionPolicy(param_dtype=self.publish_dtype, reduce_dtype=torch.float32)
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.model = model
        t = cfg.trainer
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t.lr,
                                           betas=tuple(t.betas), weight_decay=t.weight_decay)
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)

    def clip_grad(self, max_norm: float) -> float:
        """Clip the gradient norm over all ranks' shards; returns the norm before clipping."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    def train_step(self, groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
        return train_step(self.model, self.optimizer, self.clip_grad, groups, step, ctx)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective. Rank 0 gets every tensor (CPU, publish dtype); other ranks get {}."""
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return {}
        return {k: (v.to(self.publish_dtype) if v.is_floating_point() else v) for k, v in sd.items()}
