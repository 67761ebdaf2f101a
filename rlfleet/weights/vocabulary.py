"""Whether two model folders share one vocabulary: the check on-policy distillation needs before it starts.

The distillation advantage is teacher_logprob(token) - student_logprob(token) at every response token (the
trainer's `distill` estimator): the teacher scores the *student's token ids*. That is only meaningful when id i is
the same token for both models and both output layers have the same width. A teacher with another tokenizer would
score other tokens silently and train the student towards noise, so a run is refused at start-up (by `rlfleet run` /
`rlfleet check`, rlfleet/local/preflight.py, and again by the trainer before it loads the teacher) with a message
saying what differs.

What is compared: the logits width (config.json vocab_size), the tokenizer's length, its special tokens (bos, eos,
pad, unk ids), the token string of every id (the whole vocabulary: a swapped pair of ids is caught), and the ids a
few probe strings encode to (the pre-tokenizer and normaliser agree, not only the table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlfleet.weights.model_source import ModelError

PROBES = ("12+34=", "Hello, world! The answer is 42.", " spaces  and\ttabs\n", "<think>2+2=4</think>")


def _config_vocab_size(folder: Path) -> int | None:
    config = folder / "config.json"
    if not config.is_file():
        raise ModelError(f"{folder} is not a Hugging Face model folder (no config.json)")
    data = json.loads(config.read_text())
    size = data.get("vocab_size", (data.get("text_config") or {}).get("vocab_size"))
    return int(size) if size is not None else None


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - any loader error: one message naming the folder
        raise ModelError(f"{folder}: no tokenizer could be loaded ({type(exc).__name__}: {exc})") from None


def vocabulary_differences(student: Path, teacher: Path) -> list[str]:
    """What differs between the two folders' vocabularies (empty: they match)."""
    diffs: list[str] = []
    s_size, t_size = _config_vocab_size(student), _config_vocab_size(teacher)
    if s_size != t_size:
        diffs.append(f"config.json vocab_size {s_size} vs {t_size}")
    s_tok, t_tok = _tokenizer(student), _tokenizer(teacher)
    if len(s_tok) != len(t_tok):
        diffs.append(f"tokenizer length {len(s_tok)} vs {len(t_tok)}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(s_tok, name), getattr(t_tok, name)
        if a != b:
            diffs.append(f"{name} {a} vs {b}")
    s_vocab, t_vocab = s_tok.get_vocab(), t_tok.get_vocab()          # token string -> id
    moved = sorted((tok, i, t_vocab.get(tok)) for tok, i in s_vocab.items() if t_vocab.get(tok) != i)
    if moved:
        shown = ", ".join(f"{tok!r}: id {i} vs {j}" for tok, i, j in moved[:3])
        diffs.append(f"{len(moved)} token(s) with another id or missing ({shown}{', ...' if len(moved) > 3 else ''})")
    for text in PROBES:
        a_ids, b_ids = s_tok.encode(text), t_tok.encode(text)
        if a_ids != b_ids:
            diffs.append(f"{text!r} encodes to {a_ids[:8]} vs {b_ids[:8]}")
            break
    return diffs


def check_same_vocabulary(student: str | Path, teacher: str | Path) -> None:
    """Raise ModelError naming what differs when the teacher's vocabulary is not the student's."""
    diffs = vocabulary_differences(Path(student), Path(teacher))
    if diffs:
        raise ModelError(f"trainer.teacher.model_path {teacher} does not share the student's vocabulary "
                         f"(model.path {student}): {'; '.join(diffs)}. On-policy distillation scores the student's "
                         "token ids with the teacher, so both must use the same tokenizer")
