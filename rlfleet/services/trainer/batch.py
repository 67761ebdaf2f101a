"""Samples -> TrainBatch (padded tensors), this rank's slice of a batch, and response-token logprobs from a model."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch

from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.entropy import record_entropy
from rlfleet.services.trainer.logits_window import logits_window
from rlfleet.services.trainer.reward_baselines import reward_baselines_extras
from rlfleet.services.trainer.routing_replay import ROUTES_KEY, RoutingReplay, routes_tensor
from rlfleet.services.trainer.token_versions import TOKEN_VERSIONS, token_versions_tensor
from rlfleet.v1 import buffer_pb2


def group_samples(samples: Sequence[Sample], group_ids: Sequence[str] = ()) -> list[list[Sample]]:
    """Samples grouped by group_id, groups in `group_ids` order (then first appearance), each ordered by index."""
    groups: dict[str, list[Sample]] = {gid: [] for gid in group_ids}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    return [sorted(g, key=lambda s: s.index) for g in groups.values() if g]


def rank_groups(batch: buffer_pb2.Batch, rank: int, world_size: int, minibatches: int = 1) -> list[list[Sample]]:
    """The groups `rank` trains on: of each of the `minibatches` contiguous global minibatches, its contiguous
    1/world_size slice (minibatches=1: simply the rank's contiguous slice). So minibatch m is the same set of groups
    whatever the world size. The group count must divide evenly."""
    groups = group_samples([Sample.from_proto(m) for m in batch.samples], list(batch.group_ids))
    parts = world_size * minibatches
    if len(groups) % parts:
        raise ValueError(f"batch for step {batch.step} has {len(groups)} groups, not divisible by "
                         f"trainer.world_size*minibatches={world_size}*{minibatches}")
    per_mb, per_rank = len(groups) // minibatches, len(groups) // parts
    return [g for m in range(minibatches)
            for g in groups[m * per_mb + rank * per_rank:m * per_mb + (rank + 1) * per_rank]]


def build_train_batch(samples: Sequence[Sample], pad_id: int = 0, routes: bool = False) -> TrainBatch:
    """Right-padded prompt+response rows; response mask from each sample's loss mask (0 on padding).

    A response token needs a preceding token to be predicted from, so with an empty prompt the first response
    token is masked out. routes: lay the samples' MoE routes out in extras[ROUTES_KEY] for routing replay.
    Vectorised: each field of every sample is joined into one array and scattered into its padded rows at once
    (no per-token or per-row Python work).
    """
    n = len(samples)
    p_len = np.array([len(s.prompt_ids) for s in samples], dtype=np.int64)              # [S]
    t_len = np.array([len(s.response_ids) for s in samples], dtype=np.int64)            # [S]
    seq_len = int((p_len + t_len).max(initial=0))                                       # L
    resp_len = int(t_len.max(initial=0))                                                # T
    rows_l = np.arange(seq_len)[None, :] < (p_len + t_len)[:, None]                     # [S, L] real tokens
    rows_t = np.arange(resp_len)[None, :] < t_len[:, None]                              # [S, T] real responses
    input_ids: np.ndarray = np.full((n, seq_len), pad_id, dtype=np.int64)               # [S, L]
    input_ids[rows_l] = _joined([a for s in samples for a in (s.prompt_ids, s.response_ids)], np.int64)
    response_mask: np.ndarray = np.zeros((n, resp_len), dtype=np.float32)               # [S, T]
    response_mask[rows_t] = np.clip(_joined([s.loss_mask if s.loss_mask is not None else np.ones(len(s.response_ids))
                                             for s in samples], np.float32), 0, 1)
    if resp_len:
        response_mask[(p_len == 0) & (t_len > 0), 0] = 0.0                          # nothing predicts it
    rollout_logprobs: np.ndarray = np.zeros((n, resp_len), dtype=np.float32)            # [S, T]
    rollout_logprobs[rows_t] = _joined([s.rollout_logprobs for s in samples], np.float32)
    group_of: dict[str, int] = {}
    for s in samples:
        group_of.setdefault(s.group_id, len(group_of))
    return TrainBatch(
        input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(rows_l.astype(np.int64)),
        response_mask=torch.from_numpy(response_mask), response_start=torch.from_numpy(p_len),
        rollout_logprobs=torch.from_numpy(rollout_logprobs),
        rewards=torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
        group_index=torch.tensor([group_of[s.group_id] for s in samples], dtype=torch.int64),
        weight_versions=torch.tensor([int(s.weight_version) for s in samples], dtype=torch.int64),
        sample_ids=[s.sample_id for s in samples],
        extras={TOKEN_VERSIONS: token_versions_tensor(samples, resp_len),                  # [S, T]
                **reward_baselines_extras(samples),                                        # [S] (ReMax)
                **(_route_extras(samples, seq_len) if routes else {})},
    )


def _joined(parts: Sequence[Sequence[float] | np.ndarray], dtype: type) -> np.ndarray:
    """One flat array of the parts, in order (each list converted in C, not element by element in Python)."""
    arrays = [np.asarray(p, dtype=dtype) for p in parts]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def _route_extras(samples: Sequence[Sample], seq_len: int) -> dict:
    replay_routes = routes_tensor(samples, seq_len)                       # [S, L, layers, K] or None
    return {} if replay_routes is None else {ROUTES_KEY: replay_routes}


def select_rows(batch: TrainBatch, rows: torch.Tensor, trim: bool = False) -> TrainBatch:
    """The sub-batch of `rows` ([S'] indices, in that order). Every per-row field is indexed: tensors whose first
    dimension is the batch's S rows, lists of S items, and the extras that are such tensors (routes, returns, token
    versions; indexed on their own device); everything else (scalars, callables in extras) is kept as it is.
    trim: also cut input_ids and attention_mask to the longest selected row (right padding only)."""
    n = batch.input_ids.shape[0]

    def per_row(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
            return value[rows.to(value.device)]
        if isinstance(value, list) and len(value) == n:
            return [value[i] for i in rows.tolist()]
        return value

    picked = {f.name: per_row(getattr(batch, f.name)) for f in fields(batch) if f.name != "extras"}
    sub = replace(batch, **picked, extras={k: per_row(v) for k, v in batch.extras.items()})
    if not trim:
        return sub
    keep = max(int(sub.attention_mask.sum(1).max()) if sub.attention_mask.numel() else 0, 1)
    return replace(sub, input_ids=sub.input_ids[:, :keep], attention_mask=sub.attention_mask[:, :keep])


def batch_to(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch's tensors moved to device (same object, for a cheap CPU no-op)."""
    for name, value in vars(batch).items():
        if isinstance(value, torch.Tensor):
            setattr(batch, name, value.to(device))
    return batch


def pick_response_logits(logits: torch.Tensor, batch: TrainBatch, first: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target positions [S, T], the logits that predict them [S, T, V']) for logits [S, L - first, V'] of
    positions first.. (V' may be a tensor-parallel slice of the vocabulary). The logit at position i predicts token
    i + 1; L >= 2."""
    seq_len, t = first + logits.shape[1], batch.response_mask.shape[1]
    offsets = torch.arange(t, device=logits.device)                                        # [T]
    target_pos = (batch.response_start[:, None] + offsets[None, :]).clamp(1, seq_len - 1)  # [S, T]
    pred_pos = (target_pos - 1 - first).clamp(min=0)                                       # [S, T]
    return target_pos, torch.gather(logits, 1, pred_pos[:, :, None].expand(-1, -1, logits.shape[2]))


def first_read_position(batch: TrainBatch) -> int:
    """The earliest position whose logits response_logprobs reads: the shortest prompt's last token."""
    if batch.response_mask.shape[1] == 0 or batch.response_start.numel() == 0:
        return 0
    return max(int(batch.response_start.min()) - 1, 0)


def response_logprobs(logits: torch.Tensor, batch: TrainBatch, temperature: float, first: int = 0) -> torch.Tensor:
    """Logprob of each response token under logits / temperature (temperature 0 means 1). -> [S, T] float32.

    logits: [S, L - first, V], of positions first..L-1; the logit at position i predicts token i + 1. Masked
    positions hold a finite dummy value.
    """
    s, seq_len, _ = logits.shape
    seq_len += first
    t = batch.response_mask.shape[1]
    if t == 0 or s == 0 or seq_len < 2:
        return logits.new_zeros((s, t), dtype=torch.float32) + 0.0 * logits.sum()
    target_pos, picked = pick_response_logits(logits, batch, first)                    # [S, T], [S, T, V]
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(picked.float() / scale, dim=-1)                          # [S, T, V]
    record_entropy(batch, logp)                                                        # extras["entropy"] [S, T]
    targets = torch.gather(batch.input_ids, 1, target_pos)                             # [S, T]
    return torch.gather(logp, 2, targets[:, :, None]).squeeze(2)                       # [S, T]


def forward_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                     replay: RoutingReplay | None = None) -> torch.Tensor:
    """Run the causal LM on the batch and return response-token logprobs [S, T].

    replay: the model's RoutingReplay; its MoE layers then use the batch's recorded routes (extras[ROUTES_KEY]).
    """
    first, keep = logits_window(model, batch.input_ids.shape[1], first_read_position(batch))
    with replay.replaying(batch.extras.get(ROUTES_KEY)) if replay is not None else nullcontext():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **keep)
    return response_logprobs(out.logits, batch, temperature, first)                      # logits [S, L - first, V]
