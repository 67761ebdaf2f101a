"""Which module swaps the FSDP trainer takes (rlfleet/services/trainer/fast_paths/, MODEL_SWAPS): for configurations of
the addition example with overrides, on a device and compute dtype, the names `apply_model_swaps` applies, in order,
are those the backend's former condition ladder applied (the expected lists are written out from that ladder:
fp32 attention for a non-float32 dtype on CPU; fused RMSNorm, oneDNN linears and grid attention for float32 when their
perf switches are on, grid attention also needing perf.shared_prompt; none of them under trainer.on_policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from rlfleet.config import apply_overrides, parse_config
from rlfleet.services.trainer.fast_paths import MODEL_SWAPS, apply_model_swaps

ADDITION = Path(__file__).resolve().parents[3] / "examples" / "addition" / "config.yaml"

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16

CASES = [
    # (overrides of the addition config, device, compute dtype, the swaps applied in order)
    pytest.param({}, CPU, F32, ["fused_rms_norm", "grid_attention"], id="addition-as-is"),
    pytest.param({"perf.onednn_linear": True}, CPU, F32, ["fused_rms_norm", "onednn_linears", "grid_attention"],
                 id="cpu-fp32-all"),
    pytest.param({"perf.onednn_linear": True}, CPU, BF16, ["fp32_attention"], id="cpu-bf16"),
    pytest.param({"perf.onednn_linear": True}, CUDA, BF16, [], id="cuda-bf16"),
    pytest.param({"perf.onednn_linear": True, "perf.shared_prompt_unpadded": False}, CUDA, F32,
                 ["fused_rms_norm", "onednn_linears"], id="cuda-fp32-padded"),
    pytest.param({"perf.shared_prompt": False, "perf.trainer_fused_norm": False}, CPU, F32, [],
                 id="cpu-fp32-switched-off"),
    pytest.param({"perf.onednn_linear": True, "perf.shared_prompt": False}, CPU, F32,
                 ["fused_rms_norm", "onednn_linears"], id="cpu-fp32-no-shared-prompt"),
    pytest.param({"perf.onednn_linear": True, "trainer.on_policy": True}, CPU, F32, [], id="on-policy"),
]


def _model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


@pytest.mark.parametrize(("overrides", "device", "dtype", "expected"), CASES)
def test_the_swaps_applied_are_the_former_ladders(overrides: dict[str, Any], device: torch.device,
                                                  dtype: torch.dtype, expected: list[str]) -> None:
    cfg = parse_config(apply_overrides(yaml.safe_load(ADDITION.read_text()), overrides), str(ADDITION))
    assert apply_model_swaps(_model(), cfg, device, dtype) == expected


def test_the_table_lists_each_swap_once_in_the_ladders_order() -> None:
    assert [s.name for s in MODEL_SWAPS] == ["fp32_attention", "fused_rms_norm", "onednn_linears", "grid_attention"]
