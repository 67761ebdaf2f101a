"""Per-token weight versions in a TrainBatch (partial rollouts continued in place) and the version metrics.

A sample continued across a weight update has token_versions [T]; other samples have one version for every token.
Off-policy correction needs no extra term: each token's rollout logprob is the one its producing version computed,
so the per-token importance weights of the loss (TIS / icepop: exp(old - rollout)) already correct each span against
the policy that sampled it. The versions feed the staleness metrics (and any user loss that wants them, from
batch.extras[TOKEN_VERSIONS]).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample

TOKEN_VERSIONS = "token_versions"      # batch.extras key: [S, T] int64


def token_versions_tensor(samples: Sequence[Sample], resp_len: int) -> torch.Tensor:
    """[S, T] int64: the version that produced each response token (padding: the sample's weight_version)."""
    out = torch.tensor([int(s.weight_version) for s in samples], dtype=torch.int64)[:, None].repeat(1, resp_len)
    for row, s in enumerate(samples):
        if s.token_versions:
            out[row, :len(s.token_versions)] = torch.from_numpy(np.asarray(s.token_versions, dtype=np.int64))
    return out


def _versions(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(versions [S, T] int64, valid [S, T] bool) on the response mask's device."""
    mask = batch.response_mask > 0                                                      # [S, T]
    versions = batch.extras.get(TOKEN_VERSIONS)
    if not isinstance(versions, torch.Tensor):
        versions = batch.weight_versions[:, None].expand_as(mask)                       # [S, T]
    return versions.to(mask.device), mask


def version_sums(batch: TrainBatch) -> list[float]:
    """[samples spanning several versions, samples with tokens, sum of token versions, tokens] over valid tokens:
    sums, so ranks all-reduce them; version_totals turns the global sums into metrics."""
    versions, mask = _versions(batch)
    big = torch.iinfo(torch.int64).max
    rows = mask.any(dim=1)                                                              # [S]
    mixed = (torch.where(mask, versions, -1).amax(dim=1) > torch.where(mask, versions, big).amin(dim=1)) & rows
    return [float(mixed.sum()), float(rows.sum()), float(versions[mask].sum()), float(mask.sum())]


def version_totals(sums: Sequence[float]) -> dict[str, float]:
    mixed, rows, version_sum, tokens = sums
    if tokens <= 0:
        return {}
    return {"mixed_version_samples": mixed / max(rows, 1.0), "token_version_mean": version_sum / tokens}


def version_metrics(batch: TrainBatch, policy_version: int | None = None) -> dict[str, float]:
    """Over valid (loss-mask) tokens: oldest and newest version, the fraction of samples whose tokens span several
    versions, and (with policy_version) the mean lag of a token behind the policy being trained."""
    versions, mask = _versions(batch)
    if not bool(mask.any()):
        return {}
    big = torch.iinfo(torch.int64).max
    low = torch.where(mask, versions, big).amin(dim=1)                                  # [S]
    high = torch.where(mask, versions, -1).amax(dim=1)                                  # [S]
    rows = mask.any(dim=1)                                                              # [S]
    out = {"token_version_min": float(low[rows].min()), "token_version_max": float(high[rows].max()),
           "mixed_version_samples": float(((high > low) & rows).sum()) / max(int(rows.sum()), 1)}
    if policy_version is not None:
        out["token_version_lag_mean"] = float((policy_version - versions)[mask].float().mean())
    return out
