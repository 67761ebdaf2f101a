"""FSDP2 backend: torch.distributed (gloo on CPU, NCCL on CUDA), HF causal LM sharded per decoder layer, AdamW.

Options (trainer.*): precision (bf16 compute with fp32 master weights on CUDA, fp32 on CPU), activation
checkpointing, sequence packing (rlfleet/services/trainer/sequence_packing.py), LoRA adapters
(rlfleet/services/trainer/lora.py), an LR
schedule, and the auxiliary models some algorithms need: the reference model (kl.coef > 0), the distillation teacher
and PPO's critic, each sharded the same way. The fast paths (rlfleet/services/trainer/fast_paths/: module swaps before
sharding, the on-policy and shared-prompt forwards) are taken through that package's door.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlfleet.config import Config
from rlfleet.model_specs import apply_specs, load_specs
from rlfleet.sample import Sample
from rlfleet.security.bound_store import rendezvous_store
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import needs_critic, needs_teacher
from rlfleet.services.trainer.aux_models import FrozenScorer
from rlfleet.services.trainer.backends.shard_loading import build_meta_model, files_name_every_parameter, load_shards
from rlfleet.services.trainer.batch import forward_logprobs
from rlfleet.services.trainer.critic import Critic
from rlfleet.services.trainer.fast_paths import apply_model_swaps, load_kwargs, training_forward
from rlfleet.services.trainer.hooks import call_hooks
from rlfleet.services.trainer.lora import apply_lora, is_adapter
from rlfleet.services.trainer.optimizer import adamw
from rlfleet.services.trainer.routing_replay import RoutingReplay, router_specs
from rlfleet.services.trainer.schedule import build_scheduler, restore_scheduler, scheduler_state
from rlfleet.services.trainer.sequence_packing import packed_forward_logprobs
from rlfleet.services.trainer.step import ForwardFn, StepContext, train_step
from rlfleet.services.weight_sync.transports.sharded import ShardedState
from rlfleet.weights.dtypes import DTYPES
from rlfleet.weights.tied import TIED_OPTION, encode_aliases, tied_aliases
from rlfleet.weights.vocabulary import check_same_vocabulary

log = logging.getLogger(__name__)

# How long a collective may take (trainer.collective_timeout_s; this is its default). Rank 0's waits for a batch or an
# evaluation are not collectives: the other ranks wait in heartbeat broadcasts (rlfleet/services/trainer/
# leader_wait.py), so no collective has to outlast rollout.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def trainer_device(device: str, rank: int) -> torch.device:
    """cpu, or the CUDA device of this rank (LOCAL_RANK, else rank modulo the visible devices)."""
    if not device.startswith("cuda"):
        return torch.device("cpu")
    if ":" in device:
        return torch.device(device)
    local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
    return torch.device("cuda", local)


def init_distributed(rendezvous: str, rank: int, world_size: int, device: torch.device,
                     timeout: timedelta = COLLECTIVE_TIMEOUT) -> None:
    """Join the trainer's process group at rendezvous host:port (MASTER_ADDR:MASTER_PORT env when empty); rank 0
    holds the store, bound to that host (or RLFLEET_POD_IP) when it is this machine's."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not rendezvous and "MASTER_ADDR" in os.environ:
        rendezvous = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}"
    if world_size == 1 and not rendezvous:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    if not rendezvous:
        raise ValueError(f"trainer.world_size={world_size} needs endpoints.rendezvous (host:port)")
    host, _, port = rendezvous.rpartition(":")
    # rank 0's store listens on the rendezvous host only when it can (rlfleet/security/bound_store.py)
    store = rendezvous_store(host.strip("[]"), int(port), rank, world_size, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


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
                 hooks: Sequence[object] = ()) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.data_rank, self.data_world = rank, world_size          # every rank is a data-parallel rank
        t = cfg.trainer
        self.publish_dtype = DTYPES[cfg.model.dtype]
        # Meta-device build + per-rank shard reads (backends/shard_loading.py) unless the model must exist whole
        # before sharding: LoRA adapters are initialised on it, and after_model_init hooks see it.
        self.loaded_by_shards = False
        specs = load_specs(cfg.model.specs)          # model.specs: imported and checked before any weight is read
        if not t.lora.rank and not hooks and not specs:
            model = build_meta_model(cfg.model_path, **load_kwargs(t.on_policy))
            # a checkpoint whose names transformers converts at load (fused MoE experts) loads whole instead
            self.loaded_by_shards = files_name_every_parameter(model, cfg.model_path)
        if not self.loaded_by_shards:
            model = AutoModelForCausalLM.from_pretrained(str(cfg.model_path), dtype=torch.float32,
                                                         **load_kwargs(t.on_policy))
            model.to(device)
        # model.specs: the same code as the torch engine's, before LoRA, hooks, R3, the fast paths and FSDP
        self.model_specs = apply_specs(model, specs)
        if t.lora.rank:                  # before the hook, so a hook sees the model that trains
            apply_lora(model, t.lora.rank, t.lora.alpha, t.lora.targets, seed=cfg.run.seed)
        call_hooks(hooks, "after_model_init", model)
        # R3: hooks on the MoE routers, installed before sharding; None for trainer.routing_replay: false
        self.routing_replay = RoutingReplay(model, router_specs(cfg.model.router_scores)) \
            if cfg.trainer.routing_replay else None
        if t.activation_checkpointing:          # recompute each decoder layer's activations in backward
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.mesh = init_device_mesh(device.type, (world_size,))
        self.compute_dtype = compute_dtype(t.precision, device)
        apply_model_swaps(model, cfg, device, self.compute_dtype)   # fast_paths/: before FSDP wraps the layers
        self.model = self._shard(model)
        if self.loaded_by_shards:
            load_shards(self.model, cfg.model_path, rank, world_size, device)
        self.optimizer = adamw(model.parameters(), lr=t.lr, betas=(t.betas[0], t.betas[1]),
                               weight_decay=t.weight_decay, fused=cfg.perf.fused_optimizer)
        self.scheduler = build_scheduler(self.optimizer, t.scheduler, t.steps)
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        packed: ForwardFn | None = partial(packed_forward_logprobs, max_tokens=t.packing.max_tokens,
                                           pad_id=self.pad_id, compute_dtype=self.compute_dtype) \
            if t.packing.enabled else None
        # true on-policy (batch-invariant kernels) or the shared-prompt layout around it (fast_paths/)
        self.forward = training_forward(cfg, packed, model.config._attn_implementation, self.pad_id,
                                        self.compute_dtype)
        self.reference = FrozenScorer(cfg.model_path, device, self._shard, self._forward, specs=specs) \
            if t.kl.coef > 0 else None
        self.teacher = None
        if needs_teacher(t):        # a teacher algorithm without a teacher path: refused by check_trainer (config)
            assert t.teacher.model_path, "rlfleet.config.check_trainer refuses this config"
            check_same_vocabulary(cfg.model_path, t.teacher.model_path)       # raises ModelError naming the difference
            self.teacher = FrozenScorer(t.teacher.model_path, device, self._shard, self._forward)
        self.critic = Critic(t.critic, cfg.model_path, device, self._shard, _clip_module_grad, t.betas,
                             fused=cfg.perf.fused_optimizer) \
            if needs_critic(t) else None
        self._trained_ids: list[str] = []         # sample ids trained on since the last checkpoint (this rank)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 per decoder layer, then the whole model; bf16 compute with fp32 master weights when enabled."""
        mp = MixedPrecisionPolicy() if self.compute_dtype == torch.float32 else \
            MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=self.mesh, mp_policy=mp)
        fully_shard(model, mesh=self.mesh, mp_policy=mp)
        return model

    def _forward(self, model: torch.nn.Module, batch: Any, temperature: float) -> torch.Tensor:
        if self.forward is not None:
            return self.forward(model, batch, temperature)
        return forward_logprobs(model, batch, temperature)

    def clip_grad(self, max_norm: float) -> float:
        """Clip the gradient norm over all ranks' shards; returns the norm before clipping."""
        return _clip_module_grad(self.model, max_norm)

    def train_step(self, groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
        ctx = replace(ctx, routing_replay=self.routing_replay, forward=self.forward, reference=self.reference,
                      teacher=self.teacher, critic=self.critic)
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = train_step(self.model, self.optimizer, self.clip_grad, groups, step, ctx)
        self.scheduler.step()                               # one scheduler step per trainer step
        self._trained_ids.extend(s.sample_id for g in groups for s in g)
        metrics["lr"] = lr
        if self.routing_replay is not None:
            metrics.update(self.routing_replay.pop_stats())     # this rank's r3_replayed, r3_route_mismatch
        return metrics

    # -- checkpoints (rlfleet/services/trainer/backends/__init__.py uses these when present) ------------------------

    def _aux(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        return {"critic": (self.critic.model, self.critic.optimizer)} if self.critic is not None else {}

    def save_checkpoint(self, run_dir: Path, step: int, version: int, keep: int) -> Path:
        """Collective: model, optimizer, critic, scheduler, RNG, committed sample ids, HF config files."""
        t = self.cfg.trainer
        meta: dict[str, Any] = {"model_path": str(Path(self.cfg.model_path).resolve())}
        if t.lora.rank:
            meta["lora"] = {"rank": t.lora.rank, "alpha": t.lora.alpha, "targets": list(t.lora.targets)}
        path = checkpoint.save(run_dir, step, version, self.model, self.optimizer, self.device, keep,
                               aux=self._aux(), json_state={"scheduler": scheduler_state(self.scheduler)},
                               meta_extra=meta, sample_ids=self._trained_ids,
                               files=hf_side_files(self.cfg.model_path) if self.rank == 0 else {})
        self._trained_ids = []
        return path

    def load_checkpoint(self, info: checkpoint.CheckpointInfo) -> None:
        checkpoint.load(info, self.model, self.optimizer, self.device, aux=self._aux())
        state = checkpoint.read_json_state(info, "scheduler")
        if state is not None:
            restore_scheduler(self.scheduler, state)
        self._trained_ids = []

    @property
    def adapter_options(self) -> dict[str, str] | None:
        """LoRA: the manifest options of an adapter-only publish (None: full weights)."""
        lora = self.cfg.trainer.lora
        if not lora.rank:
            return None
        return {"rank": str(lora.rank), "alpha": repr(float(lora.alpha)), "targets": ",".join(lora.targets)}

    def sharded_state(self) -> ShardedState:
        """What a publish sends, gathered one parameter at a time as a sender reaches it (iterate on every rank
        together): the same names, dtypes and values as full_state_dict(), without the whole model on rank 0."""
        return ShardedState(self.model, self.publish_dtype, self._publish_names)

    @cached_property
    def _publish_names(self) -> list[str]:
        """The model's structure is fixed: worked out at the first publish. Tied weights are sent once."""
        return [k for k in self.model.state_dict() if k not in self._tied_aliases and
                (not self.cfg.trainer.lora.rank or is_adapter(k))]

    @cached_property
    def _tied_aliases(self) -> dict[str, str]:
        return tied_aliases(self.model)                    # rlfleet/weights/tied.py

    def publish_state(self) -> ShardedState:
        return self.sharded_state()

    def publish_options(self) -> dict[str, str]:
        """Manifest options of a publish: the tied aliases not sent (their source tensor is)."""
        aliases = {a: s for a, s in self._tied_aliases.items()
                   if not self.cfg.trainer.lora.rank or is_adapter(a)}
        return {TIED_OPTION: encode_aliases(aliases)} if aliases else {}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective. Rank 0 gets every tensor (CPU, publish dtype) -- with LoRA only the adapters; others get {}."""
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return {}
        if self.cfg.trainer.lora.rank:
            sd = {k: v for k, v in sd.items() if is_adapter(k)}
        return {k: (v.to(self.publish_dtype) if v.is_floating_point() else v) for k, v in sd.items()}


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    """trainer.precision -> the FSDP2 compute dtype (parameters are kept in fp32 either way: the master copy)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def _clip_module_grad(model: torch.nn.Module, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


SIDE_FILE_LIMIT = 16 * 2**20


def hf_side_files(model_path: Path | str) -> dict[str, bytes]:
    """The model folder's config and tokenizer files (not weights) as hf/NAME, for `rlfleet convert`."""
    out = {}
    for f in sorted(Path(model_path).iterdir()):
        weights = f.suffix in (".safetensors", ".bin", ".pt", ".pth")
        if f.is_file() and not weights and f.stat().st_size < SIDE_FILE_LIMIT:
            out[f"hf/{f.name}"] = f.read_bytes()
    return out
