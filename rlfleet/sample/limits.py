"""Bounds a Sample must respect beyond its own consistency: the model's vocabulary and experts, published versions.

Checked where every Sample message enters (rlfleet.sample.validate_message, used by the buffer's Put, single or
batched), so a poison sample is refused with the field named and never reaches the trainer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOGPROB_TOLERANCE = 1e-3     # a log-probability is <= 0; float rounding in an engine's log_softmax stays far below
MAX_VERSION = 2**63 - 1      # weight_version (uint64 on the wire) must fit the trainer's int64 tensors
MAX_MOE_LAYERS = 256         # routed_experts.num_layers: 1..this (DeepSeek-V3 has 61 MoE layers, Qwen3-235B 94)
MAX_TOP_K = 64               # routed_experts.top_k: 1..this (and <= the model's expert count when known)
MAX_EXPERT_ID = 2**15 - 1    # the trainer lays routes out as int16 (routing_replay.routes_tensor)
DEFAULT_MAX_SEQ_LEN = 131072  # Put's bound on prompt + response tokens when neither the config nor the model says


@dataclass(frozen=True)
class SampleLimits:
    vocab_size: int | None = None          # token ids must be < this
    num_experts: int | None = None         # routed expert ids must be < this
    max_weight_version: int | None = None  # weight_version / token_versions must be <= this
    max_expert_id: int | None = None       # routed expert ids must be <= this (the trainer's: MAX_EXPERT_ID)
    max_seq_len: int | None = None         # prompt + response tokens must be <= this (put_max_seq_len)


def model_limits(model_path: Path) -> SampleLimits:
    """vocab_size and the expert count from a Hugging Face model folder's config.json (None where unknown), and the
    largest expert id the trainer can lay out."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        log.warning("no model config.json at %s (%s): token ids are not checked against the vocabulary", model_path,
                    exc)
        return SampleLimits(max_expert_id=MAX_EXPERT_ID)
    text = cfg.get("text_config", cfg)
    experts = next((text[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if text.get(k)), None)
    vocab = text.get("vocab_size")
    return SampleLimits(vocab_size=int(vocab) if vocab else None, num_experts=int(experts) if experts else None,
                        max_expert_id=MAX_EXPERT_ID)


def _model_config(model_path: Path) -> dict | None:
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else None


def model_context(model_path: Path) -> int | None:
    """The model's context length from config.json: max_position_embeddings, times rope_scaling's factor when the
    config scales RoPE past it (YaRN, linear, dynamic); None when the config does not say."""
    text = _model_config(model_path)
    positions = text.get("max_position_embeddings") if text else None
    if not isinstance(positions, int) or positions <= 0:
        return None
    scaling = (text or {}).get("rope_scaling") or {}
    factor = scaling.get("factor", 1.0) if isinstance(scaling, dict) else 1.0
    return int(positions * max(1.0, float(factor))) if isinstance(factor, int | float) else positions


def put_max_seq_len(configured: int | None, model_path: Path) -> int:
    """The buffer's Put bound on a sample's prompt + response tokens: trainer.max_seq_len when set, else the model's
    context (model_context), else DEFAULT_MAX_SEQ_LEN."""
    return configured or model_context(model_path) or DEFAULT_MAX_SEQ_LEN
