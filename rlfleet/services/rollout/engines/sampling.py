"""Per-row token choice for a batch of sequences: temperature, top-k, top-p, greedy, and the chosen token's logprob.

The returned logprob is log_softmax(logits / T) at the chosen token (T = 1 for greedy), taken *before* top-k/top-p
filtering, so a teacher-forced forward of the same model at temperature T reproduces it.

Sampling is by inverse CDF with one uniform per row from the request's own generator, so a row's draw never depends
on the batch. It reads the logits a few times, not once per vocabulary entry with a random number each (what
torch.multinomial does: on CPU that alone is ~100 ms a step for 64 rows of a 49k vocabulary):
- one pass for the row maxima, one for exp(x - max), one for block sums (an argmax, by blocks, only where a row
  is greedy);
- the cumulative sum is taken over blocks of `BLOCK` entries, then inside the one block the uniform falls in, so
  the serial scan covers V / BLOCK + BLOCK entries a row instead of V.
Rows with top-k/top-p take the exact sorted path on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 256                    # vocabulary entries per block of the two-level CDF


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


def _uniforms(rngs: Sequence[np.random.Generator | None], like: torch.Tensor) -> torch.Tensor:
    """One uniform in [0, 1) per row from that row's generator: [S, 1] in like's dtype and device."""
    draws = [(rng.random() if rng is not None else float(np.random.default_rng().random())) for rng in rngs]
    return torch.tensor(draws, dtype=like.dtype, device=like.device).unsqueeze(1)


def _search(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """cdf: [S, N] non-decreasing; target: [S, 1]. The first index whose cdf exceeds target, clamped to N-1: [S]."""
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """x: [S, V]. Index of each row's first maximum, as torch.argmax, in two short passes (torch.argmax over a wide
    row is ~10x slower than amax on CPU): the first block holding the row maximum, then the first maximum in it."""
    rows, vocab = x.shape
    if vocab < 4 * BLOCK or vocab % BLOCK:
        return x.argmax(dim=-1)
    block = x.view(rows, -1, BLOCK).amax(-1).argmax(-1)                            # [S]
    cols = block.unsqueeze(1) * BLOCK + torch.arange(BLOCK, device=x.device)      # [S, BLOCK]
    return block * BLOCK + x.gather(1, cols).argmax(-1)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights: [S, V] non-negative, unnormalised; u: [S, 1] uniforms in [0, 1). Returns ids [S]: the first id whose
    cumulative weight exceeds u · total, i.e. a draw from weights / total. Never an id of weight 0."""
    rows, vocab = weights.shape
    if vocab < 4 * BLOCK:
        cdf = torch.cumsum(weights, dim=-1)                                       # [S, V]
        picks = _search(cdf, u * cdf[:, -1:])
    else:
        full = vocab // BLOCK * BLOCK
        sums = weights[:, :full].reshape(rows, -1, BLOCK).sum(-1)                 # [S, V // BLOCK]
        if full < vocab:
            sums = torch.cat([sums, weights[:, full:].sum(-1, keepdim=True)], dim=1)
        block_cdf = torch.cumsum(sums, dim=-1)                                    # [S, NB]
        target = u * block_cdf[:, -1:]                                            # [S, 1]
        block = _search(block_cdf, target)                                        # [S]
        before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0).unsqueeze(1)).squeeze(1),
                             torch.zeros_like(target[:, 0]))                      # [S] mass of earlier blocks
        cols = block.unsqueeze(1) * BLOCK + torch.arange(BLOCK, device=weights.device)   # [S, BLOCK]
        inside = cols < vocab
        local = weights.gather(1, cols.clamp(max=vocab - 1)) * inside            # [S, BLOCK]
        offset = _search(torch.cumsum(local, dim=-1), target - before.unsqueeze(1))
        picks = (block * BLOCK + offset).clamp(max=vocab - 1)
    impossible = weights.gather(1, picks.unsqueeze(1)).squeeze(1) <= 0           # rounding at a block's very top
    if bool(impossible.any()):
        picks = torch.where(impossible, first_argmax(weights), picks)
    return picks


def choose_tokens(logits: torch.Tensor, rows: Sequence[RowSampling], exact_logprobs: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [B, V] (any float dtype). Returns (tokens [B] int64, logprobs [B] float32), both on logits.device.

    exact_logprobs: take the logprobs from `torch.log_softmax` itself (one more pass over the logits), so that they
    equal a recomputation that calls it bitwise (true on-policy mode runs it as a batch-invariant kernel)."""
    logits = logits.float()
    temps = [r.temperature if r.temperature > 0 else 1.0 for r in rows]
    scaled = logits if all(t == 1.0 for t in temps) else \
        logits / torch.tensor(temps, device=logits.device).unsqueeze(1)          # [B, V]
    top = scaled.amax(dim=-1)                                                     # [B]
    weights = (scaled - top.unsqueeze(1)).exp_()                                  # [B, V] unnormalised softmax
    log_total = torch.log(weights.sum(dim=-1))                                    # [B]
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    filtered = [i for i in sampled if rows[i].top_k > 0 or 0 < rows[i].top_p < 1]
    plain = [i for i in sampled if i not in set(filtered)]
    if len(plain) == len(rows):                                                   # every row samples, unfiltered
        tokens = inverse_cdf(weights, _uniforms([r.rng for r in rows], weights))
    else:
        tokens = first_argmax(scaled)                                             # [B] greedy ids
        if plain:
            sub = weights[plain]                                                  # [S, V]
            picks = inverse_cdf(sub, _uniforms([rows[i].rng for i in plain], sub))
            tokens = tokens.index_put((torch.tensor(plain, device=logits.device),), picks)
    if filtered:
        index = torch.tensor(filtered, device=logits.device)
        top_k = torch.tensor([rows[i].top_k for i in filtered], device=logits.device)
        top_p = torch.tensor([rows[i].top_p if 0 < rows[i].top_p < 1 else 1.0 for i in filtered],
                             device=logits.device)
        probs = torch.softmax(_filter_top_k_top_p(scaled[index], top_k, top_p), dim=-1)   # [F, V]
        picks = inverse_cdf(probs, _uniforms([rows[i].rng for i in filtered], probs))
        tokens = tokens.index_put((index,), picks)
    if exact_logprobs:
        return tokens, torch.log_softmax(scaled, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    chosen = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - top - log_total  # [B] log_softmax at the token
    return tokens, chosen
