"""Response-token logprobs from Megatron's vocab-parallel logits, without gathering the vocabulary."""

from __future__ import annotations

import torch

from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.batch import pick_response_logits


def parallel_response_logprobs(logits: torch.Tensor, batch: TrainBatch, temperature: float, vocab_size: int,
                               vocab_start: int) -> torch.Tensor:
    """Logprob of each response token under logits / temperature (0 means 1) -> [S, T] float32, equal on every
    tensor-parallel rank. Same positions and dummy values as rlfleet.services.trainer.batch.response_logprobs.

    logits: [S, L, V/tp], this rank's vocabulary columns vocab_start .. vocab_start + V/tp - 1 (columns >= vocab_size
    are padding and excluded from the softmax).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    s, seq_len, local_vocab = logits.shape
    t = batch.response_mask.shape[1]
    if t == 0 or s == 0 or seq_len < 2:
        return logits.new_zeros((s, t), dtype=torch.float32) + 0.0 * logits.sum()
    target_pos, picked = pick_response_logits(logits, batch)                               # [S, T], [S, T, V/tp]
    scale = temperature if temperature > 0 else 1.0
    picked = picked.float() / scale
    if vocab_start + local_vocab > vocab_size:                                             # padded columns
        columns = torch.arange(vocab_start, vocab_start + local_vocab, device=logits.device)
        picked = picked.masked_fill(columns >= vocab_size, float("-inf"))
    targets = torch.gather(batch.input_ids, 1, target_pos)                                 # [S, T]
    return -vocab_parallel_cross_entropy(picked, targets)                                  # [S, T]
