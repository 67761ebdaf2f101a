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


@dataclass(frozen=True)
class SampleLimits:
    vocab_size: int | None = None          # token ids must be < this
    num_experts: int | None = None         # routed expert ids must be < this
    max_weight_version: int | None = None  # weight_version / token_versions must be <= this


def model_limits(model_path: Path) -> SampleLimits:
    """vocab_size and the expert count from a Hugging Face model folder's config.json (None where unknown)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        log.warning("no model config.json at %s (%s): token ids are not checked against the vocabulary", model_path,
                    exc)
        return SampleLimits()
    text = cfg.get("text_config", cfg)
    experts = next((text[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if text.get(k)), None)
    vocab = text.get("vocab_size")
    return SampleLimits(vocab_size=int(vocab) if vocab else None, num_experts=int(experts) if experts else None)
