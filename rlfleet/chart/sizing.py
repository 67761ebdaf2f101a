"""What the values check knows about the cluster and the model (the values' `sizing` section: the chart renders
nothing from it), and the arithmetic the checks share.

Rules and where their numbers come from (docs/cluster.md "Checking values before install"):
- bf16 size: 2 bytes per parameter.
- SGLang's KV pool per GPU (0.5.23: model_config.get_num_kv_heads, pool_configurator's cell size): each token takes
  max(1, kv_heads // tp) x 2 (K and V) x head_dim x layers x 2 bytes (bf16 KV); the pool gets what
  mem_fraction_static of the GPU leaves after the weights' share (bf16 size / tp), capped by --max-total-tokens.
  SGLang also keeps activation headroom out of that, so the figure is an upper bound.
- Read-back: READ_BACK_SECONDS_PER_BF16_GB of weights (bench/read_back_cost.py), refused above READ_BACK_MAX_BF16_GB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rlfleet.chart.values import ValuesError

GiB = 1 << 30
BF16_BYTES = 2
# fp32 master weights + fp32 gradients + Adam's two fp32 moments, sharded over every trainer rank (FSDP2 here keeps
# fp32 master weights under bf16 compute: rlfleet/services/trainer/backends/fsdp.py).
TRAINER_STATE_BYTES_PER_PARAM = 4 + 4 + 8
# Host memory a pod needs, in bf16 sizes of the model. Trainer: rank 0 gathers the full fp32 state and its bf16 copy
# for the exported checkpoint (fsdp.full_state_dict, cpu_offload): 3x. Rollout: the version being fetched and the
# last version sent (verify sent keeps it for its digest): 2x.
TRAINER_HOST_BF16_COPIES = 3
ROLLOUT_HOST_BF16_COPIES = 2
# Measured by bench/read_back_cost.py on a CPU SGLang 0.5.23 server (docs/cluster.md): CPU seconds (server and
# replica together) to read every tensor back, per GB of bf16 weights (0.72 us a parameter on SmolLM2-135M; the wire
# carries each value as float32 JSON text whatever the dtype). All of it is CPU work, on a GPU node too.
READ_BACK_SECONDS_PER_BF16_GB = 360.0
# Above this many GB of bf16 weights, verify read_back would take more than READ_BACK_MAX_SECONDS per version.
READ_BACK_MAX_SECONDS = 60.0
READ_BACK_MAX_BF16_GB = round(READ_BACK_MAX_SECONDS / READ_BACK_SECONDS_PER_BF16_GB, 2)      # 0.17 GB: ~85M params

_QUANTITY = re.compile(r"^([0-9.]+(?:e[0-9]+)?)([KMGTPE]i?|k|m)?$")
_FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
            "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def memory_bytes(quantity: Any) -> float:
    """A Kubernetes memory quantity (900Gi, 512M, 1e9, 1073741824) in bytes."""
    m = _QUANTITY.match(str(quantity).strip())
    if not m:
        raise ValuesError(f"{quantity!r} is not a Kubernetes memory quantity")
    return float(m.group(1)) * _FACTORS[m.group(2)]


@dataclass(frozen=True)
class ModelSize:
    """sizing.model: parameters (billions) and the attention shape SGLang's KV cache follows."""

    params_b: float = 0.0
    layers: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0

    @property
    def bf16_bytes(self) -> float:
        return self.params_b * 1e9 * BF16_BYTES

    def kv_bytes_per_token(self, tp: int) -> int:
        """One token's K and V on one GPU of a tp-way replica, bf16."""
        return max(1, self.kv_heads // tp) * 2 * self.head_dim * self.layers * BF16_BYTES


@dataclass(frozen=True)
class Sizing:
    """The values' `sizing` section."""

    gpus_per_node: int = 0
    gpu_memory_gib: float = 0.0
    racks: dict[str, int] = field(default_factory=dict)       # rack label value -> nodes
    total_gpus: int = 0
    prompt_tokens: int = 0
    accept_slow_read_back: bool = False
    model: ModelSize = ModelSize()

    @staticmethod
    def from_values(values: dict[str, Any]) -> Sizing:
        s = values.get("sizing") or {}
        m = s.get("model") or {}
        try:
            return Sizing(int(s.get("gpusPerNode", 0)), float(s.get("gpuMemoryGiB", 0)),
                          {str(k): int(v) for k, v in (s.get("racks") or {}).items()}, int(s.get("totalGPUs", 0)),
                          int(s.get("promptTokens", 0)), bool(s.get("acceptSlowReadBack", False)),
                          ModelSize(float(m.get("paramsB", 0)), int(m.get("layers", 0)), int(m.get("heads", 0)),
                                    int(m.get("kvHeads", 0)), int(m.get("headDim", 0))))
        except (TypeError, ValueError) as exc:
            raise ValuesError(f"sizing: {exc}") from exc


def kv_pool_tokens(model: ModelSize, gpu_memory_gib: float, mem_fraction_static: float, tp: int,
                   max_total_tokens: int) -> int:
    """Tokens SGLang's KV pool holds at most on each GPU of a replica (every GPU of it holds every token's share)."""
    room = gpu_memory_gib * GiB * mem_fraction_static - model.bf16_bytes / tp
    return max(0, min(max_total_tokens, int(room // model.kv_bytes_per_token(tp))))


def heads_split(model: ModelSize, tp: int) -> str:
    """'' when tp GPUs can split the attention heads as SGLang 0.5.23 does (layers/linear.py QKVParallelLinear:
    heads divide by tp; KV heads divide by tp, or tp by KV heads, which are then replicated); else why not."""
    if model.heads % tp:
        return f"{model.heads} attention heads do not divide over tp {tp}"
    if model.kv_heads and (model.kv_heads % tp if model.kv_heads >= tp else tp % model.kv_heads):
        return f"{model.kv_heads} KV heads and tp {tp}: neither divides the other"
    return ""


def read_back_seconds(model: ModelSize) -> float:
    return model.bf16_bytes / 1e9 * READ_BACK_SECONDS_PER_BF16_GB
