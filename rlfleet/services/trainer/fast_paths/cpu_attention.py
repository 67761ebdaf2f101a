"""bf16 training on CPU with attention kept in float32 (`trainer.precision: bf16` on a CPU device).

On CPU, bf16 matmuls are ~2x faster than float32 where the CPU has bf16 instructions (AVX512-BF16, AMX), but
torch's CPU flash-attention backward in bf16 is many times slower than in float32: measured on the addition
example's trainer step (AMD EPYC Zen 4, one thread), `mm` 66 -> 33 ms a step in bf16 while the attention backward
went 9 -> 74 ms, so a bf16 step (143 ms) was slower than a float32 one (122 ms). This attention implementation runs
transformers' SDPA attention on float32 copies of q, k and v and casts its output back to the compute dtype, so the
projections and MLPs run in bf16 and the attention in float32 (autograd casts the gradients the same way back).

It is registered with transformers' attention registry (`AttentionInterface`, the documented plug point for
attention functions) under FP32_SDPA, with the SDPA mask builder, and set on a model by `use_fp32_attention`.
"""

from __future__ import annotations

from typing import Any

import torch

from rlfleet.services.trainer.fast_paths.attention_swap import swap_sdpa

FP32_SDPA = "rlfleet_sdpa_fp32"


def sdpa_fp32(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [B, H, Lq, Dh], key / value [B, Hkv, Lk, Dh] in the compute dtype -> ([B, Lq, H, Dh] in that dtype,
    None): transformers' SDPA attention computed in float32."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return out.to(query.dtype), None


def use_fp32_attention(model: Any) -> bool:
    """Switch a model that uses SDPA attention to FP32_SDPA; True if it was switched."""
    return swap_sdpa(model, FP32_SDPA, sdpa_fp32)
