"""Per-row token choice for a batch of sequences: temperature, top-k, top-p, greedy, and the chosen token's logprob.

The returned logprob is log_softmax(logits / T) at the chosen token (T = 1 for greedy), taken *before* top-k/top-p
filtering, so a teacher-forced forward of the same model at temperature T reproduces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RowSampling:
    temperature: float          # 0 = greedy
    top_p: float                # >= 1 or <= 0: off
    top_k: int                  # 0: off
    rng: np.random.Generator | None     # the request's own stream: its draws do not depend on the batch


def _filter_top_k_top_p(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """scaled: [B, V]; top_k: [B] (0 = off); top_p: [B] (1 = off). Returns scaled with removed entries at -inf."""
    vocab = scaled.shape[-1]
    sorted_logits, sorted_idx = torch.sort(scaled, dim=-1, descending=True)       # [B, V]
    ranks = torch.arange(vocab, device=scaled.device).unsqueeze(0)                # [1, V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(1)  # [B, 1]
    remove = ranks >= k
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs                                  # mass strictly above each entry
    remove |= before >= top_p.unsqueeze(1)                                        # the first entry is always kept
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, sorted_idx, sorted_logits)


def choose_tokens(logits: torch.Tensor, rows: Sequence[RowSampling]) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] (any float dtype). Returns (tokens [B] int64, logprobs [B] float32), both on logits.device."""
    logits = logits.float()
    device = logits.device
    temps = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows], device=device)
    scaled = logits / temps.unsqueeze(1)                                           # [B, V]
    logprobs_all = torch.log_softmax(scaled, dim=-1)                               # [B, V]
    tokens = torch.argmax(logits, dim=-1)                                          # [B] greedy by default
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if sampled:
        sub = scaled[sampled]                                                      # [S, V]
        top_k = torch.tensor([rows[i].top_k for i in sampled], device=device)
        top_p = torch.tensor([rows[i].top_p if 0 < rows[i].top_p < 1 else 1.0 for i in sampled], device=device)
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            sub = _filter_top_k_top_p(sub, top_k, top_p)
        tokens[sampled] = _inverse_cdf(torch.softmax(sub, dim=-1), [rows[i].rng for i in sampled])
    chosen = logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)                # [B]
    return tokens, chosen


def _inverse_cdf(probs: torch.Tensor, rngs: Sequence[np.random.Generator | None]) -> torch.Tensor:
    """probs: [S, V]. One uniform per row from that row's generator; returns the sampled ids [S]."""
    uniforms = [(rng.random() if rng is not None else float(np.random.default_rng().random())) for rng in rngs]
    cdf = torch.cumsum(probs, dim=-1)                                              # [S, V]
    u = torch.tensor(uniforms, dtype=cdf.dtype, device=cdf.device).unsqueeze(1) * cdf[:, -1:]   # [S, 1]
    picks = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)    # [S]
    impossible = probs.gather(1, picks.unsqueeze(1)).squeeze(1) <= 0              # rounding at the very top
    return torch.where(impossible, probs.argmax(dim=-1), picks)
