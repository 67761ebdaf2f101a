"""Checkpoints a person can load: each checkpoint's hf/ folder gets the policy's model.safetensors next to its config
and tokenizer files (so `AutoModelForCausalLM.from_pretrained(step_N/hf)` works), and the end of a run writes
RUN_DIR/final/ (safetensors in model.dtype, tokenizer, chat template). Rank 0 only, after the checkpoint is complete.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from safetensors.torch import save_file

from rlfleet.services.trainer.export import convert, merge_lora, read_policy_state

log = logging.getLogger(__name__)


def add_hf_weights(ckpt: Path) -> Path:
    """Write ckpt/hf/model.safetensors (atomically: temp, fsync, rename); returns ckpt/hf."""
    hf = ckpt / "hf"
    meta = json.loads((ckpt / "meta.json").read_text())
    state = merge_lora(read_policy_state(ckpt), meta.get("lora"))
    config = json.loads((hf / "config.json").read_text()) if (hf / "config.json").is_file() else {}
    if config.get("tie_word_embeddings") and "lm_head.weight" in state:
        state.pop("lm_head.weight")                  # tied: HF re-ties it to the input embedding on load
    hf.mkdir(exist_ok=True)
    tmp = hf / ".tmp-model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, hf / "model.safetensors")
    return hf


def export_checkpoint(ckpt: Path) -> None:
    """add_hf_weights, logged instead of raised: a checkpoint stays usable for resuming whatever happens here."""
    try:
        add_hf_weights(ckpt)
    except Exception as exc:  # noqa: BLE001 - e.g. a backend whose state names are not HF names
        log.warning("checkpoint %s: no hf/model.safetensors written (%s: %s); use `rlfleet convert`", ckpt,
                    type(exc).__name__, exc)


def write_final(ckpt: Path, run_dir: Path, dtype: str) -> Path | None:
    """RUN_DIR/final: the last checkpoint's policy as an HF folder in model.dtype."""
    try:
        out = convert(ckpt, run_dir / "final", dtype)
    except Exception as exc:  # noqa: BLE001
        log.warning("no final/ folder written from %s (%s: %s)", ckpt, type(exc).__name__, exc)
        return None
    log.info("final model in %s", out)
    return out
