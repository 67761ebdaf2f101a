"""PPO's critic: a second HF model with a scalar value head (AutoModelForTokenClassification, num_labels=1),
trained in the same FSDP2 backend with its own AdamW.

values[s, t] = V(state before response token t) = the head's output at the position that predicts token t
(the same positions the policy's logprobs are read at). Value loss: clipped around the old values,
0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2), a global token mean like the policy loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from rlfleet.config import CriticConfig
from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.optimizer import adamw

Shard = Callable[[torch.nn.Module], None]
ClipGrad = Callable[[torch.nn.Module, float], float]


def response_positions(batch: TrainBatch) -> torch.Tensor:
    """[S, T] index in the row of the position whose output concerns response token t (predicts it)."""
    seq_len = batch.input_ids.shape[1]
    t = batch.response_mask.shape[1]
    offsets = torch.arange(t, device=batch.input_ids.device)
    target = (batch.response_start[:, None] + offsets[None, :]).clamp(1, max(seq_len - 1, 1))
    return target - 1


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, token_count: float) -> torch.Tensor:
    """values (grad), old_values, returns, mask: [S, T] -> this rank's share of the global token mean."""
    valid = mask > 0
    err = (values - returns) ** 2
    if clip > 0:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    zero = torch.zeros((), device=values.device)
    return 0.5 * torch.where(valid, err, zero).sum() / max(float(token_count), 1.0)


class Critic:
    def __init__(self, cfg: CriticConfig, default_path: str | Path, device: torch.device, shard: Shard,
                 clip_grad: ClipGrad, betas: tuple[float, float], fused: bool = True) -> None:
        from transformers import AutoModelForTokenClassification

        model = AutoModelForTokenClassification.from_pretrained(str(cfg.model_path or default_path), num_labels=1,
                                                                dtype=torch.float32)
        head = getattr(model, "score", None) or getattr(model, "classifier", None)
        if head is not None:                         # start from V = 0 everywhere: a neutral baseline
            with torch.no_grad():
                for p in head.parameters():
                    p.zero_()
        model.to(device)
        shard(model)
        self.cfg, self.model, self._clip_grad = cfg, model, clip_grad
        self.optimizer = adamw(model.parameters(), lr=cfg.lr, betas=betas, fused=fused)

    def _values(self, batch: TrainBatch) -> torch.Tensor:
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        per_pos = out.logits[..., 0].float()                                               # [S, L]
        if batch.response_mask.shape[1] == 0:
            return per_pos[:, :0] + 0.0 * per_pos.sum()
        return torch.gather(per_pos, 1, response_positions(batch))                        # [S, T]

    def values(self, batch: TrainBatch) -> torch.Tensor:
        self.model.train()
        with torch.no_grad():
            return self._values(batch).detach()                                            # [S, T]

    def train_minibatch(self, mb: TrainBatch, returns: torch.Tensor, token_count: float, world_size: int,
                        grad_clip: float) -> dict[str, float]:
        """One critic update on a minibatch (collective). Returns this rank's metric shares."""
        assert mb.values is not None
        values = self._values(mb)                                                          # [S', T]
        loss = value_loss(values, mb.values, returns, mb.response_mask, self.cfg.value_clip, token_count)
        (loss * world_size).backward()
        norm = self._clip_grad(self.model, grad_clip)
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        valid = mb.response_mask > 0
        denom = max(float(token_count), 1.0)
        return {"value_loss": float(loss.detach()),
                "value_mean": float(torch.where(valid, values.detach(), 0.0).sum() / denom),
                "return_mean": float(torch.where(valid, returns, 0.0).sum() / denom),
                "critic_grad_norm_share": norm / world_size if math.isfinite(norm) else 0.0}
