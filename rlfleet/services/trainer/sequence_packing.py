"""Sequence packing: variable-length samples share rows of up to `max_tokens` tokens, with no attention across
samples and position ids that restart at 0 for each sample.

Masking. With flash-attention (`attn_implementation` flash_attention_2/3) the model gets `position_ids` only and
attention_mask None: HF derives the varlen boundaries from the restarting position ids. Every other attention
(sdpa, eager; the CPU path) gets an explicit block-diagonal causal 4D float mask [R, 1, L, L] (0 = attend,
dtype-min = blocked), which HF passes through unchanged. Padding at the end of a row forms its own block.

Logprobs of sample s are read at its offset in its row exactly as rlfleet/services/trainer/batch.py reads them from a
padded row, so packed and unpacked logprobs agree to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.entropy import record_entropy

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor           # [R, L] int64
    position_ids: torch.Tensor        # [R, L] int64, restarting at 0 per sample
    segment: torch.Tensor             # [R, L] int64: which sample of the row each token belongs to (-1 padding)
    row: torch.Tensor                 # [S] int64: the row of each sample
    offset: torch.Tensor              # [S] int64: index in its row of the sample's first token


def plan_rows(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Samples (by index) of each row: first fit in sample order; a sample longer than max_tokens gets its own row."""
    rows: list[list[int]] = []
    used: list[int] = []
    for i, n in enumerate(lengths):
        for r, u in enumerate(used):
            if u + n <= max_tokens:
                rows[r].append(i)
                used[r] += n
                break
        else:
            rows.append([i])
            used.append(n)
    return rows


def pack(batch: TrainBatch, max_tokens: int, pad_id: int = 0) -> Packed:
    """The batch's rows (prompt + response, without padding) packed into as few rows as first-fit gives."""
    lengths = [int(n) for n in batch.attention_mask.sum(1).tolist()]                  # [S]
    rows = plan_rows(lengths, max_tokens)
    width = max((sum(lengths[i] for i in r) for r in rows), default=0)
    width = max(width, 1)
    dev = batch.input_ids.device
    ids = torch.full((len(rows), width), pad_id, dtype=torch.int64, device=dev)      # [R, L]
    pos = torch.zeros((len(rows), width), dtype=torch.int64, device=dev)             # [R, L]
    seg = torch.full((len(rows), width), -1, dtype=torch.int64, device=dev)          # [R, L]
    row_of = torch.zeros(len(lengths), dtype=torch.int64, device=dev)                # [S]
    offset = torch.zeros(len(lengths), dtype=torch.int64, device=dev)                # [S]
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            n = lengths[i]
            ids[r, at:at + n] = batch.input_ids[i, :n]
            pos[r, at:at + n] = torch.arange(n, device=dev)
            seg[r, at:at + n] = k
            row_of[i], offset[i] = r, at
            at += n
        pos[r, at:] = torch.arange(width - at, device=dev)           # padding: a block of its own
    return Packed(input_ids=ids, position_ids=pos, segment=seg, row=row_of, offset=offset)


def block_causal_mask(segment: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """segment [R, L] -> additive mask [R, 1, L, L]: 0 where query i may see key j (same segment, j <= i)."""
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()      # [L, L]
    same = segment[:, :, None] == segment[:, None, :]                                         # [R, L, L]
    allowed = same & causal[None]
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=segment.device)
    blocked.masked_fill_(~allowed, torch.finfo(dtype).min)
    return blocked[:, None]                                                                   # [R, 1, L, L]


def packed_response_logprobs(logits: torch.Tensor, packed: Packed, batch: TrainBatch, temperature: float
                             ) -> torch.Tensor:
    """logits [R, L, V] of the packed rows -> logprobs [S, T] of each sample's response tokens (float32)."""
    s, t = batch.response_mask.shape
    if t == 0 or s == 0:
        return logits.new_zeros((s, t), dtype=torch.float32) + 0.0 * logits.sum()
    seq_len = int(batch.attention_mask.sum(1).max())
    offsets = torch.arange(t, device=logits.device)                                           # [T]
    local = (batch.response_start[:, None] + offsets[None, :]).clamp(1, max(seq_len - 1, 1))  # [S, T] in-sample
    lengths = batch.attention_mask.sum(1)                                                     # [S]
    local = torch.minimum(local, (lengths[:, None] - 1).clamp(min=1))                         # stay in the sample
    target = packed.offset[:, None] + local                                                   # [S, T] in the row
    rows = packed.row[:, None].expand(s, t)                                                   # [S, T]
    picked = logits[rows, target - 1]                                                         # [S, T, V]
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(picked.float() / scale, dim=-1)                                  # [S, T, V]
    record_entropy(batch, logp)                                                               # extras["entropy"]
    targets = packed.input_ids[rows, target]                                                  # [S, T]
    return torch.gather(logp, 2, targets[:, :, None]).squeeze(2)                              # [S, T]


def packed_forward_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float, max_tokens: int,
                            pad_id: int = 0, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Run the causal LM on the packed batch; response-token logprobs [S, T] (masked positions: finite dummies)."""
    packed = pack(batch, max_tokens, pad_id)
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attn in VARLEN_ATTENTION:
        mask = None
    elif attn == "eager":                                         # eager adds the mask to the scores
        mask = block_causal_mask(packed.segment, compute_dtype or _compute_dtype(model))
    else:                                                         # sdpa: a boolean mask, True = attend
        mask = block_causal_mask(packed.segment, torch.float32) == 0
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask, use_cache=False)
    return packed_response_logprobs(out.logits, packed, batch, temperature)


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None)
    return weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
