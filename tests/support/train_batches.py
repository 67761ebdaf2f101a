"""TrainBatch builders for tests of advantages and losses: only the fields those read are given, the rest are
one-token placeholders (input ids 0, attention 1, response at 0, version 0)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import torch

from rlfleet.protocols import TrainBatch

Rows: TypeAlias = "Sequence[Sequence[float]] | torch.Tensor"


def _rows(values: Rows, s: int, t: int) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float32).reshape(s, t)


def train_batch(mask: Rows, *, rewards: Sequence[float] | None = None, groups: Sequence[int] | None = None,
                rollout: Rows | None = None, old: Rows | None = None, ref: Rows | None = None,
                extras: dict[str, Any] | None = None, **fields: Any) -> TrainBatch:
    """S rows of T response positions: response_mask = mask [S, T]; rewards [S] and groups [S] (default 0 each);
    rollout/old/ref logprobs [S, T] (rollout default 0, old and ref default absent); further TrainBatch fields by
    keyword (values, teacher_logprobs, old_logprobs as a tensor, ...). S is len(rewards) when given, so an empty
    mask makes [S, 0]."""
    s = len(rewards) if rewards is not None else len(mask)
    t = len(mask[0]) if len(mask) else 0
    m = _rows(mask, s, t)                                                          # [S, T]
    return TrainBatch(input_ids=torch.zeros(s, 1, dtype=torch.int64),
                      attention_mask=torch.ones(s, 1, dtype=torch.int64),
                      response_mask=m, response_start=torch.zeros(s, dtype=torch.int64),
                      rollout_logprobs=torch.zeros(s, t) if rollout is None else _rows(rollout, s, t),
                      rewards=torch.zeros(s) if rewards is None else torch.tensor(rewards, dtype=torch.float32),
                      group_index=torch.zeros(s, dtype=torch.int64) if groups is None else
                      torch.tensor(groups, dtype=torch.int64),
                      weight_versions=torch.zeros(s, dtype=torch.int64), sample_ids=[str(i) for i in range(s)],
                      **{"old_logprobs": None if old is None else _rows(old, s, t),
                         "ref_logprobs": None if ref is None else _rows(ref, s, t), **fields},
                      extras=dict(extras or {}))
