"""Megatron-core backend: GPTModel from the HF config with tensor, pipeline and data parallelism; the same train-step
plugins as the FSDP backend; HF-named full state dict for publishing; its own sharded checkpoints.

Construct on every rank after rlfleet.services.trainer.backends.fsdp.init_distributed. Ranks are laid out as
megatron-core
does (tensor-parallel fastest, then data, then pipeline); data-parallel rank `data_rank` trains on the groups
`rank_groups(batch, data_rank, data_world)`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlfleet.config import Config, check_megatron, megatron_unsupported
from rlfleet.sample import Sample
from rlfleet.services.trainer.backends.megatron import checkpoint as megatron_checkpoint
from rlfleet.services.trainer.backends.megatron.convert import MG_OUTPUT, Layout, hf_to_megatron, tp_dim
from rlfleet.services.trainer.backends.megatron.gather import full_state_dict
from rlfleet.services.trainer.backends.megatron.grads import clip_gradients, reduce_gradients
from rlfleet.services.trainer.backends.megatron.model import Precision, build_gpt_model, model_shape, transformer_config
from rlfleet.services.trainer.backends.megatron.step import MegatronStep, StepModel
from rlfleet.services.trainer.checkpoint import CheckpointInfo
from rlfleet.services.trainer.hooks import call_hooks
from rlfleet.services.trainer.optimizer import adamw
from rlfleet.services.trainer.schedule import build_scheduler, restore_scheduler, scheduler_state
from rlfleet.services.trainer.step import StepContext
from rlfleet.weights.dtypes import DTYPES

log = logging.getLogger(__name__)


def _load_hf_state(model_path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The HF config and full fp32 state dict (every rank reads it; each keeps only its shards)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return hf_config, state


def init_model_parallel(tp: int, pp: int, world_size: int) -> None:
    """Build megatron-core's process groups on the already initialised default group."""
    from megatron.core import parallel_state

    if world_size % (tp * pp):
        raise ValueError(f"world size {world_size} is not a multiple of tensor_parallel*pipeline_parallel={tp * pp}")
    if parallel_state.model_parallel_is_initialized():
        if (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size()) != (tp, pp):
            raise RuntimeError("megatron-core model parallelism is already initialised with another layout")
        return
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)


def unsupported(cfg: Config) -> list[str]:
    """Trainer features the Megatron backend does not implement (yet), as config field names (the table lives in
    rlfleet/config/trainer_checks.py, so `rlfleet check` refuses them too)."""
    return megatron_unsupported(cfg.trainer)


def compute_dtype(cfg: Config, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: fp32 compute). trainer.precision auto: bf16 on CUDA, fp32 on CPU; parameters and
    AdamW state stay fp32 (master weights) either way."""
    precision = cfg.trainer.precision
    if precision == "fp32" or device.type != "cuda":
        return None
    if precision == "bf16":
        return torch.bfloat16
    dtype = DTYPES[cfg.model.dtype]
    return torch.bfloat16 if dtype == torch.float32 else dtype


class MegatronBackend:
    """One trainer rank's GPTModel stage and AdamW optimizer."""

    def __init__(self, cfg: Config, rank: int, world_size: int, device: torch.device,
                 hooks: Sequence[object] = ()) -> None:
        from megatron.core import parallel_state, tensor_parallel

        check_megatron(cfg.trainer)
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        m = cfg.trainer.megatron
        init_model_parallel(m.tensor_parallel, m.pipeline_parallel, world_size)
        self.layout = Layout(tp_rank=parallel_state.get_tensor_model_parallel_rank(), tp=m.tensor_parallel,
                             pp_rank=parallel_state.get_pipeline_model_parallel_rank(), pp=m.pipeline_parallel)
        self.data_rank = parallel_state.get_data_parallel_rank()
        self.data_world = parallel_state.get_data_parallel_world_size()
        if device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(cfg.run.seed)
        self.publish_dtype = DTYPES[cfg.model.dtype]
        compute = compute_dtype(cfg, device)
        hf_config, hf_state = _load_hf_state(cfg.model_path)
        self.shape = model_shape(hf_config)
        self.config = transformer_config(self.shape, self.layout.tp, self.layout.pp, device, Precision(compute=compute),
                                         recompute=cfg.trainer.activation_checkpointing)
        model = build_gpt_model(self.shape, self.config, self.layout.first_stage, self.layout.last_stage)
        model.load_state_dict(hf_to_megatron(self.shape, hf_state, self.layout), strict=True)
        del hf_state
        self.model = model.to(device)
        call_hooks(hooks, "after_model_init", self.model)
        t = cfg.trainer
        self.optimizer = adamw(self.model.parameters(), lr=t.lr, betas=(t.betas[0], t.betas[1]),
                               weight_decay=t.weight_decay, fused=cfg.perf.fused_optimizer)
        self.scheduler = build_scheduler(self.optimizer, t.scheduler, t.steps)
        self.pad_id = int(getattr(hf_config, "pad_token_id", None) or 0)
        self._tied_output = self._tied_weight()
        self._step = MegatronStep(StepModel(
            model=self.model, optimizer=self.optimizer, layout=self.layout, dp_rank=self.data_rank,
            dp_size=self.data_world, vocab_size=self.shape.vocab_size, microbatches=m.microbatches,
            metrics_src=self._metrics_rank(), reduce_and_clip=self.clip_grad))

    def _tied_weight(self) -> torch.nn.Parameter | None:
        """The tied embedding's copy on this stage (first: embedding, last: output layer), when pp > 1."""
        if not self.shape.tied or self.layout.pp == 1:
            return None
        if self.layout.first_stage:
            return self.model.embedding.word_embeddings.weight
        if self.layout.last_stage:
            return self.model.output_layer.weight
        return None

    def _metrics_rank(self) -> int:
        """Global rank of the last stage's tp-0, dp-0 rank (where loss metrics are read)."""
        mine = dist.get_rank() if self.layout.last_stage and self.layout.tp_rank == 0 and self.data_rank == 0 else -1
        t = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    @property
    def layout_record(self) -> dict[str, int]:
        return {"tensor_parallel": self.layout.tp, "pipeline_parallel": self.layout.pp,
                "data_parallel": self.data_world}

    def clip_grad(self, max_norm: float) -> float:
        """Reduce gradients over data-parallel ranks (and the tied embedding's stages), then clip to the global
        norm; returns the norm before clipping."""
        reduce_gradients(self.model, self._tied_output)
        return clip_gradients(self.model, max_norm, self._counted_in_norm)

    def _counted_in_norm(self, name: str) -> bool:
        if name == MG_OUTPUT and self.shape.tied:          # the last stage's copy of the tied embedding
            return False
        return tp_dim(name) is not None or self.layout.tp_rank == 0

    def train_step(self, groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
        """Collective. `groups` are this data-parallel rank's groups (the same on its tensor/pipeline peers)."""
        lr = self.optimizer.param_groups[0]["lr"]
        metrics = self._step(groups, step, ctx)
        self.scheduler.step()                               # one scheduler step per trainer step
        return {**metrics, "lr": lr}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective. Rank 0 gets every tensor under its HF name (CPU, publish dtype); other ranks get {}."""
        return full_state_dict(self.model, self.shape, self.layout, self.data_rank, self.publish_dtype)

    def publish_state(self) -> dict[str, torch.Tensor]:
        """Collective: the full state dict (the HF conversion needs whole tensors), on rank 0."""
        return self.full_state_dict()

    def publish_options(self) -> dict[str, str]:
        """The full HF state dict is sent, tied names included: nothing to add."""
        return {}

    @property
    def adapter_options(self) -> None:
        """No LoRA on this backend (unsupported() refuses trainer.lora)."""
        return None

    def save_checkpoint(self, run_dir: Path, step: int, version: int, keep: int) -> Path:
        return megatron_checkpoint.save(run_dir, step, version, self.model, self.optimizer, self.device, keep,
                                        self.layout_record, {"scheduler": scheduler_state(self.scheduler)})

    def load_checkpoint(self, info: CheckpointInfo) -> None:
        json_state = megatron_checkpoint.load(info, self.model, self.optimizer, self.device, self.layout_record)
        if json_state.get("scheduler") is not None:
            restore_scheduler(self.scheduler, json_state["scheduler"])
