"""The trainer's section of the run config (trainer.*) and its sub-sections: backend, algorithm, optimizer,
checkpoints, and each algorithm's own knobs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlfleet.config.conventions import apply_convention
from rlfleet.config.policy_losses import ClipCovConfig, KlCovConfig, MaskingConfig
from rlfleet.config.profile import ProfileConfig
from rlfleet.config.section import Section


class TisConfig(Section):
    """Rollout correction: importance weights of the trainer's vs the rollout engine's policy (losses.py)."""

    mode: Literal["tis", "icepop", "mask", "none"] = Field("tis", description="tis: truncated importance "
                                                           "sampling; icepop = mask: weight 1 inside [low, clip], "
                                                           "else 0; none: off.")
    clip: float = Field(2.0, gt=0, description="tis: weights truncated at clip; icepop/mask: kept in [low, clip].")
    low: float = Field(0.5, ge=0, description="icepop/mask: the lower bound of the kept weights.")
    level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="The ratio the weight is taken of: per token, the sequence's product (exp of the "
        "summed log-ratios) or its geometric mean (exp of the mean log-ratio), broadcast over the sequence's tokens.")


class MegatronConfig(Section):
    """trainer.backend: megatron. world_size = tensor_parallel * pipeline_parallel * data-parallel ranks."""

    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel ranks.")
    pipeline_parallel: int = Field(1, ge=1, description="Pipeline stages.")
    microbatches: int = Field(1, ge=1, description="Schedule microbatches per minibatch (pipelining depth).")


class KlConfig(Section):
    """Optional KL penalty against the reference model (the initial policy), added to the loss or the reward."""

    coef: float = Field(0.0, ge=0, description="Weight of the KL term (0: off, no reference model is loaded).")
    estimator: Literal["k1", "k2", "k3", "kl", "mse", "abs", "low_var_kl",
                       "k1+", "k2+", "k3+", "kl+", "mse+", "abs+", "low_var_kl+"] = Field(
        "k3", description="k3 = low_var_kl (clamped, verl's bounds); mse = k2; kl = k1; a trailing \"+\" keeps the "
        "value of the estimator and takes the gradient of k2 (straight-through, unbiased gradient).")
    in_reward: bool = Field(False, description="True: -coef * KL(old || ref) per token in the reward (verl's "
                            "use_kl_in_reward), not in the loss.")
    ratio_weighted: bool = Field(False, description="TRL's use_bias_correction_kl: the loss's KL times the ratio "
                                 "pi/pi_old.")
    agg: Literal["token-mean", "policy"] = Field("token-mean", description="How the loss's KL term is aggregated: "
                                                 "a global token mean, or like the policy loss (its "
                                                 "policy_loss.agg; verl and TRL). Conventions: verl policy, trl "
                                                 "policy.")
    logged: Literal["plain", "weighted"] = Field("plain", description="With ratio_weighted, the metric kl: the "
                                                 "plain estimate, or the ratio-weighted one the loss uses (TRL). "
                                                 "Conventions: verl plain, trl weighted.")


class CriticConfig(Section):
    """PPO's critic: a second HF model (model_path; default the policy's folder) with a scalar value head."""

    model_path: str | None = Field(None, description="The critic's HF folder (null: the policy's).")
    lr: float = Field(1e-5, gt=0, description="The critic's learning rate.")
    value_clip: float = Field(0.2, ge=0, description="Clip of the value update around the old values (0: none).")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE's discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE's lambda.")


class TeacherConfig(Section):
    """On-policy distillation: the teacher's logprobs are computed in the trainer from this HF folder."""

    model_path: str | None = Field(None, description="The teacher's HF folder (needed by trainer.algorithm: "
                                   "distill).")


class LoraConfig(Section):
    """LoRA: train rank-r adapters on the target Linear layers only; publish adapter weights only."""

    rank: int = Field(0, ge=0, description="Adapter rank (0: LoRA off, full fine-tuning).")
    alpha: float = Field(16.0, gt=0, description="LoRA's alpha: the adapter's output is scaled by alpha / rank.")
    targets: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj"], description="Linear module names (the last "
                               "part of the module path) that get adapters.")


class SchedulerConfig(Section):
    """Learning rate over trainer steps: linear warmup to trainer.lr, then constant or cosine to min_ratio * lr."""

    kind: Literal["constant", "cosine"] = Field("constant", description="After the warmup: constant, or cosine "
                                                "decay to min_ratio * lr at the last step.")
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warmup from 0 to trainer.lr.")
    min_ratio: float = Field(0.0, ge=0, le=1, description="cosine: the final learning rate as a fraction of "
                             "trainer.lr.")


class PackingConfig(Section):
    """Sequence packing: samples share rows of up to max_tokens tokens; no attention across samples."""

    enabled: bool = Field(False, description="Pack samples into shared rows.")
    max_tokens: int = Field(2048, ge=8, description="Tokens per packed row.")


# issue 13: verl / TRL parity (rlfleet/services/trainer/losses.py, advantages.py, batch_invariant.py)
LossAgg = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "bnpo", "dapo", "grpo", "dr_grpo"]   # TRL's loss_type names are aliases (losses.AGG_ALIASES)


class PolicyLossConfig(Section):
    """The token-level policy losses (clipped_pg, dapo, drgrpo, ppo's): aggregation, dual-clip, clamps, entropy."""

    agg: LossAgg | None = Field(None, description="Aggregation over the global batch (verl's loss_agg_mode; TRL's "
                                "loss_type names bnpo, dapo, grpo, dr_grpo are aliases). null: the loss's own "
                                "(token-mean; drgrpo: seq-mean-token-sum-norm).")
    empty_rows: Literal["exclude", "include"] = Field("exclude", description="Sequence-level denominators: exclude "
                                                      "rows without a valid token (verl), or include them (TRL).")
    clip_ratio_c: float = Field(3.0, ge=0, description="Dual-clip: a negative-advantage token's loss is at most "
                                "-A * c (0: off).")
    log_ratio_clamp: float = Field(20.0, gt=0, description="log(pi/pi_old) clamped to +-this before exp (verl: 20).")
    kl_clamp: float = Field(10.0, gt=0, description="k3 / low_var_kl clamped to +-this (verl: 10).")
    entropy_coef: float = Field(0.0, ge=0, description="loss -= coef * entropy, aggregated by entropy_agg (0: "
                                "entropy is a metric only).")
    entropy_agg: Literal["token-mean", "policy"] = Field("token-mean", description="How the entropy bonus is "
                                                         "aggregated: a global token mean (TRL), or like the policy "
                                                         "loss (verl). Conventions: verl policy, trl token-mean.")


class EstimatorConfig(Section):
    """Options of the advantage estimators."""

    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="GRPO's std: per group, over the "
                                                             "batch (TRL), or off (Dr. GRPO).")
    gamma: float = Field(1.0, ge=0, le=1, description="REINFORCE++'s discount over the response tokens.")
    std_eps: float = Field(1e-6, gt=0, description="GRPO's (r - mean) / (std + std_eps). Conventions: verl 1e-6, "
                           "trl 1e-4.")
    single_sample: Literal["reward", "zero"] = Field("reward", description="GRPO's advantage of a one-sample group "
                                                     "(no baseline): its raw reward (verl), or 0 (TRL: r minus its "
                                                     "own mean). Conventions: verl reward, trl zero.")
    whiten_std: Literal["population", "bessel"] = Field("population", description="Whitening (REINFORCE++, "
                                                        "REINFORCE++-baseline, GAE): (x - mean) / (std + 1e-8) with "
                                                        "the population std, or verl's masked_whiten (x - mean) * "
                                                        "rsqrt(var * n / (n - 1) + 1e-8). Conventions: verl bessel, "
                                                        "trl bessel.")


class DapoConfig(Section):
    """The dapo loss (trainer.algorithm: dapo): the clipped loss with clip-higher."""

    clip_high: float = Field(0.28, ge=0, description="DAPO's clip-higher: ratios are clipped to "
                             "[1 - trainer.clip_low, 1 + clip_high].")


class GspoConfig(Section):
    """The gspo loss (trainer.algorithm: gspo): the clipped loss of the sequence-level ratio."""

    clip: tuple[float, float] = Field((3e-4, 4e-4), description="GSPO's sequence-ratio clip range (low, high): "
                                      "ratios are clipped to [1 - low, 1 + high].")
    clip_fraction: Literal["sequence", "token"] = Field("sequence", description="What the metric clip_fraction "
                                                        "counts: clipped sequences over sequences (TRL), or clipped "
                                                        "tokens over tokens (verl). Conventions: verl token, trl "
                                                        "sequence.")


class DrGrpoConfig(Section):
    """Dr. GRPO (trainer.algorithm: drgrpo): the constant normaliser of seq-mean-token-sum-norm aggregation."""

    max_tokens: int = Field(0, ge=0, description="seq-mean-token-sum-norm divides by sequences * max_tokens "
                            "(0: the batch's T), in any loss that aggregates so.")


class TrainerConfig(Section):
    """The trainer: backend, algorithm, optimizer, checkpoints. Per-algorithm knobs live in their own sub-sections
    (dapo, gspo, drgrpo, critic for ppo, teacher for distill)."""

    backend: Literal["fsdp", "megatron"] = Field("fsdp", description="Training backend: FSDP2, or Megatron-core "
                                                 "(trainer.megatron).")
    megatron: MegatronConfig = Field(MegatronConfig(), description="Megatron parallelism (backend: megatron).")
    world_size: int = Field(1, ge=1, description="Trainer ranks.")
    steps: int = Field(100, ge=1, description="Trainer steps of the run (one batch of groups_per_step groups "
                       "each).")
    groups_per_step: int = Field(8, ge=1, description="Groups (prompts x rollout.group_size samples) per step.")
    algorithm: str = Field("grpo", description="Preset naming an advantage and a loss: grpo, rloo, drgrpo, gspo, "
                           "ppo, reinforce_pp, reinforce_pp_baseline, dapo, distill, sft, cispo, gpg, clip_cov, "
                           "kl_cov, opo, remax.")
    convention: Literal["rlfleet", "verl", "trl"] = Field("rlfleet", description="Sets every verl / TRL convention "
                                                          "knob the config does not set itself (kl.agg, kl.logged, "
                                                          "policy_loss.entropy_agg, policy_loss.empty_rows, "
                                                          "policy_loss.clip_ratio_c, estimator.whiten_std, "
                                                          "estimator.std_eps, estimator.single_sample, "
                                                          "gspo.clip_fraction; "
                                                          "rlfleet/config/conventions.py, docs/algorithms.md). "
                                                          "rlfleet: the fields' own defaults.")
    advantage: str | None = Field(None, description="Override the preset's advantage: a built-in name or a dotted "
                                  "path.")
    loss: str | None = Field(None, description="Override the preset's loss: a built-in name or a dotted path.")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate (the peak, with trainer.scheduler).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    clip_low: float = Field(0.2, ge=0, description="Clipped loss: ratios are clipped below at 1 - clip_low.")
    clip_high: float = Field(0.2, ge=0, description="Clipped loss: ratios are clipped above at 1 + clip_high "
                             "(dapo: trainer.dapo.clip_high).")
    minibatches: int = Field(1, ge=1, description="Optimizer updates per step: the step's batch split into this "
                             "many minibatches.")
    tis: TisConfig = Field(TisConfig(), description="Rollout correction.")
    publish_every: int = Field(1, ge=1, description="Publish weights every this many steps.")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every this many steps (and at the end).")
    collective_timeout_s: float = Field(1800.0, gt=0, description="Seconds a collective of the trainer ranks may "
                                        "take before torch.distributed fails it (the rank exits and its gang "
                                        "restarts). Rank 0's waits for a batch or an evaluation do not count: the "
                                        "other ranks wait in a heartbeat broadcast every min(10, this/10) s. Rank "
                                        "0's other work of its own (checkpoint export and seal, publishing to "
                                        "replicas) must fit in it.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept in the run folder (older ones are "
                                  "deleted).")
    hooks: list[str] = Field([], description="Dotted paths to trainer hooks (rlfleet.protocols).")
    threads: int | None = Field(None, ge=1, description="Torch threads per rank (null: placement.trainer).")
    device: str = Field("cpu", description="Torch device of the trainer ranks (cpu, cuda).")
    routing_replay: bool = Field(False, description="MoE: replay the rollout's expert routes (R3, "
                                 "trainer/routing_replay.py).")
    max_seq_len: int | None = Field(None, ge=2, description=(
        "Longest sample (prompt + response tokens) the trainer trains on; a delivered group holding a longer one is "
        "quarantined (Buffer.Reject) rather than trained on. The buffer's Put refuses longer samples too (counted "
        "per replica); None: no limit in the trainer, and Put's bound is the model's context (config.json "
        "max_position_embeddings x rope_scaling factor), else 131072 tokens."))
    kl: KlConfig = Field(KlConfig(), description="KL penalty against the reference model.")
    critic: CriticConfig = Field(CriticConfig(), description="PPO's critic (trainer.algorithm: ppo).")
    teacher: TeacherConfig = Field(TeacherConfig(), description="The distillation teacher (trainer.algorithm: "
                                   "distill).")
    lora: LoraConfig = Field(LoraConfig(), description="LoRA adapters.")
    scheduler: SchedulerConfig = Field(SchedulerConfig(), description="Learning-rate schedule.")
    packing: PackingConfig = Field(PackingConfig(), description="Sequence packing.")
    precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 compute + fp32 master "
                                                       "weights on CUDA, fp32 on CPU. bf16 on CPU keeps attention "
                                                       "in float32 (trainer/fast_paths/cpu_attention.py).")
    activation_checkpointing: bool = Field(False, description="Recompute activations in the backward (less "
                                           "memory, more compute).")
    dapo: DapoConfig = Field(DapoConfig(), description="The dapo loss.")
    gspo: GspoConfig = Field(GspoConfig(), description="The gspo loss.")
    drgrpo: DrGrpoConfig = Field(DrGrpoConfig(), description="Dr. GRPO's normaliser.")
    policy_loss: PolicyLossConfig = Field(PolicyLossConfig(), description="Aggregation, dual-clip, clamps and "
                                          "entropy of the token-level policy losses.")
    estimator: EstimatorConfig = Field(EstimatorConfig(), description="Options of the advantage estimators.")
    clip_cov: ClipCovConfig = Field(ClipCovConfig(), description="The clip_cov loss (verl's Clip-Cov).")
    kl_cov: KlCovConfig = Field(KlCovConfig(), description="The kl_cov loss (verl's KL-Cov).")
    masking: MaskingConfig = Field(MaskingConfig(), description="TRL's token and sequence masks of the policy loss.")
    on_policy: bool = Field(False, description="True on-policy: engine and trainer compute log-probs with the same "
                            "batch-invariant CPU kernels (rlfleet/cpu_kernels/invariant_ops.py), so logprob_abs_diff "
                            "is exactly 0; torch engine + fsdp on CPU, fp32 only.")
    profile: ProfileConfig = Field(ProfileConfig(), description="Torch profiler traces of chosen steps and of the "
                                   "replicas' decode under the same weight versions (docs/profiling.md).")

    @model_validator(mode="before")
    @classmethod
    def _convention(cls, data: Any) -> Any:
        """trainer.convention fills the convention knobs this section does not set (rlfleet/config/conventions.py)."""
        return apply_convention(data) if isinstance(data, dict) else data
