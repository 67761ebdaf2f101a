"""The fast paths' off-switches (the `perf` section), grouped by the component that owns each.

One flat `perf:` section in YAML (every key as before); in code it is the union of one class per owner, so a
reader sees which service a switch changes: TrainerPerf, EnginePerf, RolloutPerf and CpuPerf (both sides).
"""

from __future__ import annotations

from pydantic import Field

from rlfleet.config.section import Section


class TrainerPerf(Section):
    """The trainer's fast paths (rlfleet/services/trainer/: step.py, fast_paths/, optimizer.py)."""

    single_pass: bool = Field(True, description="minibatches 1: old logprobs from the training forward.")
    skip_zero_advantage: bool = Field(True, description="Single pass with a policy-gradient loss (no KL, entropy "
                                      "bonus or critic): rows whose advantage is 0 at every token (a GRPO group "
                                      "that scored the same) skip the forward and backward. Loss and gradients are "
                                      "unchanged; policy metrics average over the rows that trained.")
    shared_prompt: bool = Field(True, description="FSDP trainer: samples with the same prompt (a group) run it "
                                "through the model once per forward (trainer/fast_paths/shared_prompt.py).")
    shared_prompt_max_tokens: int = Field(8192, ge=16, description="Longest row of the shared-prompt layout; a "
                                          "group that does not fit is split, each part repeating the prompt.")
    shared_prompt_unpadded: bool = Field(True, description="FSDP trainer, float32, SDPA attention: the shared-prompt "
                                         "forward runs projections and MLPs on the real tokens only, attention on "
                                         "the layout's padded grid (trainer/fast_paths/grid_attention.py).")
    fused_optimizer: bool = Field(True, description="Trainer: torch's fused AdamW kernel on CPU and CUDA (~3x "
                                  "faster optimizer step; rounding differs ~1e-8 from the per-tensor loop).")
    trainer_fused_norm: bool = Field(True, description="FSDP trainer, float32 compute: RMSNorm as one fused op "
                                     "(F.rms_norm; trainer/fast_paths/fused_norm.py), same math, rounding ~1e-7.")


class EnginePerf(Section):
    """The torch engine's fast paths (rlfleet/services/rollout/engines/lean_llama/)."""

    engine_fast_decode: bool = Field(True, description="torch engine: lean Llama-family packed prefill and decode "
                                     "step on fused q/k/v and gate/up weights (engines/lean_llama/).")
    native_attention: bool = Field(True, description="CPU with AVX-512, one engine thread: the torch engine's lean "
                                   "decode step runs attention as a C kernel built at first use with the system C "
                                   "compiler (engines/lean_llama/native_attention.py; ~2x torch's ops); false, or no "
                                   "compiler: "
                                   "torch's ops.")
    engine_compile: bool = Field(False, description="torch engine: torch.compile that step (needs a compiler; slow "
                                 "start).")


class RolloutPerf(Section):
    """The rollout service's fast paths (rlfleet/services/rollout/)."""

    single_turn_collector: bool = Field(True, description="Rollout: the built-in single_turn runs every group on "
                                        "one collector thread, not a thread per group (same samples; "
                                        "services/rollout/single_turn_groups.py).")


class CpuPerf(Section):
    """CPU kernels both the trainer and the torch engine use (rlfleet/cpu_kernels/)."""

    onednn_linear: bool = Field(True, description="CPU: the torch engine's lean step and the float32 trainer's "
                                "linears run through oneDNN (rlfleet/cpu_kernels/onednn.py; ~2x MKL on AMD "
                                "CPUs, "
                                "rounding ~1e-6 apart); false: torch's own ops (MKL).")


class PerfConfig(CpuPerf, RolloutPerf, EnginePerf, TrainerPerf):
    """The fast paths' off-switches: every owner's, in one section."""
