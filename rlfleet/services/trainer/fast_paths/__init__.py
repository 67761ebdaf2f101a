"""The FSDP trainer's fast paths: optional speed code that changes how a step is computed, never what it computes
(logprobs and gradients equal the plain path's to float rounding; tests/unit/trainer_fast_paths/ checks each).

Model swaps (`MODEL_SWAPS`, applied in this order by `apply_model_swaps` before FSDP shards the model, so FSDP
registers its hooks on the swapped modules; the true on-policy mode, `trainer.on_policy`, takes none of them: its
batch-invariant kernels must see every op as torch's own):
- fp32_attention (cpu_attention.py): bf16 compute on a CPU runs attention in float32 (torch's CPU attention backward is
  many times slower in bf16). Pays on CPUs with bf16 matmul instructions (AVX512-BF16, AMX); never applies on CUDA.
- fused_rms_norm (fused_norm.py, `perf.trainer_fused_norm`): float32 compute, each RMSNorm as one `F.rms_norm` op.
  Pays on a CPU (one pass over the activations instead of five); on CUDA it applies only under
  `trainer.precision: fp32`.
- onednn_linears (onednn_linears.py, `perf.onednn_linear`): float32 compute, nn.Linear through oneDNN's AVX-512 code
  (~2x MKL's on AMD CPUs). CPU only: on CUDA oneDNN is not usable and nothing is swapped.
- grid_attention (grid_attention.py, `perf.shared_prompt` and `perf.shared_prompt_unpadded`): float32 compute, SDPA
  attention: the shared-prompt forward runs projections and MLPs on the real tokens only (~13% fewer matmul FLOPs on
  the addition example). Any device, but float32 compute only.

The training forward (`training_forward`): true on-policy runs the forward through the batch-invariant kernels of
rlfleet.cpu_kernels (`invariant_call`; the model is loaded with `load_kwargs`); otherwise `perf.shared_prompt` lays a
group's prompt out once per forward (shared_prompt.py, `SharedPromptForward`; any device), except under varlen flash
attention, where sequence packing already drops the padding.

A GPU user can ignore fp32_attention and onednn_linears (CPU only), and fused_rms_norm and grid_attention unless
training in float32; the shared-prompt forward pays on any device.

This `__init__` is the folder's one door: code outside it imports the names below from
`rlfleet.services.trainer.fast_paths`, never a module inside it (tests/unit/test_import_directions.py checks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from rlfleet.config import Config
from rlfleet.cpu_kernels import invariant_call, load_kwargs
from rlfleet.services.trainer.batch import forward_logprobs
from rlfleet.services.trainer.fast_paths.cpu_attention import use_fp32_attention
from rlfleet.services.trainer.fast_paths.fused_norm import fuse_rms_norms
from rlfleet.services.trainer.fast_paths.grid_attention import use_grid_attention
from rlfleet.services.trainer.fast_paths.onednn_linears import use_onednn_linears
from rlfleet.services.trainer.fast_paths.shared_prompt import SharedPromptForward, plan, shared_forward_logprobs
from rlfleet.services.trainer.sequence_packing import VARLEN_ATTENTION
from rlfleet.services.trainer.step import ForwardFn

__all__ = ["MODEL_SWAPS", "ModelSwap", "apply_model_swaps", "invariant_call", "load_kwargs", "plan",
           "shared_forward_logprobs", "training_forward"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSwap:
    """One fast path that swaps modules (or the attention function) of the model before it is sharded."""

    name: str
    # (cfg, device, compute dtype) -> whether this swap is taken
    applies: Callable[[Config, torch.device, torch.dtype], bool]
    # (model, device, compute dtype) -> how many modules were swapped (logged), or None
    apply: Callable[[torch.nn.Module, torch.device, torch.dtype], int | None]


def _fp32_attention(model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype) -> None:
    use_fp32_attention(model)


def _grid_attention(model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype) -> None:
    use_grid_attention(model)


def _fused_rms_norm(model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype) -> int:
    return fuse_rms_norms(model)


MODEL_SWAPS: tuple[ModelSwap, ...] = (
    ModelSwap("fp32_attention",
              applies=lambda cfg, device, dtype: dtype != torch.float32 and device.type == "cpu"
              and not cfg.trainer.on_policy,
              apply=_fp32_attention),
    ModelSwap("fused_rms_norm",
              applies=lambda cfg, device, dtype: dtype == torch.float32 and cfg.perf.trainer_fused_norm
              and not cfg.trainer.on_policy,
              apply=_fused_rms_norm),
    ModelSwap("onednn_linears",
              applies=lambda cfg, device, dtype: dtype == torch.float32 and cfg.perf.onednn_linear
              and not cfg.trainer.on_policy,
              apply=use_onednn_linears),
    ModelSwap("grid_attention",
              applies=lambda cfg, device, dtype: dtype == torch.float32 and cfg.perf.shared_prompt
              and cfg.perf.shared_prompt_unpadded and not cfg.trainer.on_policy,
              apply=_grid_attention),
)


def apply_model_swaps(model: torch.nn.Module, cfg: Config, device: torch.device, compute_dtype: torch.dtype
                      ) -> list[str]:
    """Apply, in MODEL_SWAPS order, every swap whose conditions hold (call before sharding); returns their names.
    A run with model.specs takes none: the user's modules own the module tree (a swap inside a replacement, or an
    attention function a replaced attention never calls, would change or miss it), so the spec wins."""
    if cfg.model.specs:
        log.info("model.specs replace modules: the trainer's module swaps (%s) are not taken",
                 ", ".join(s.name for s in MODEL_SWAPS))
        return []
    applied = []
    for swap in MODEL_SWAPS:
        if not swap.applies(cfg, device, compute_dtype):
            continue
        swapped = swap.apply(model, device, compute_dtype)
        applied.append(swap.name)
        if swapped is None:
            log.info("trainer fast path %s", swap.name)
        else:
            log.info("trainer fast path %s: %d modules swapped", swap.name, swapped)
    return applied


def training_forward(cfg: Config, forward: ForwardFn | None, attn_implementation: str, pad_id: int,
                     compute_dtype: torch.dtype) -> ForwardFn | None:
    """The trainer's forward around `forward` (None: the plain padded forward_logprobs): true on-policy through the
    batch-invariant kernels, else the shared-prompt layout where perf.shared_prompt asks for it and the model's
    attention (attn_implementation) is not varlen; else `forward` itself."""
    if cfg.trainer.on_policy:
        return partial(invariant_call, forward or forward_logprobs)
    if cfg.perf.shared_prompt and attn_implementation not in VARLEN_ATTENTION:
        # a group's prompt once per forward; bit-level batch invariance (on_policy) needs the padded rows
        return SharedPromptForward(forward or forward_logprobs, cfg.perf.shared_prompt_max_tokens, pad_id,
                                   compute_dtype)
    return forward
