"""Model specs for tests: replacements that break the contract in each way start-up must refuse, and a user MoE router
class with its R3 score function (named from the config by model.router_scores)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def not_a_class(original: nn.Module, path: str) -> nn.Module:
    return original


class NoFromModule(nn.Module):
    pass


class WrongSignature(nn.Module):
    @classmethod
    def from_module(cls, original: nn.Module) -> nn.Module:
        return original


class RenamesWeights(nn.Module):
    """Holds the MLP's projections under other names: its state dict differs from the original's."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.gate, self.up, self.down = original.gate_proj, original.up_proj, original.down_proj

    @classmethod
    def from_module(cls, original: nn.Module, path: str) -> RenamesWeights:
        return cls(original)


class FailsToBuild(nn.Module):
    @classmethod
    def from_module(cls, original: nn.Module, path: str) -> nn.Module:
        raise ValueError("this block needs a config field the model lacks")


class PlainTopKRouter(nn.Module):
    """A user's MoE router (softmax over experts, top-k, no renormalisation) taking over the original's weight;
    R3 knows it only through model.router_scores."""

    def __init__(self, weight: nn.Parameter, top_k: int) -> None:
        super().__init__()
        self.weight, self.top_k = weight, top_k

    @classmethod
    def from_module(cls, original: nn.Module, path: str) -> PlainTopKRouter:
        return cls(original.weight, int(original.top_k))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = hidden.reshape(-1, self.weight.shape[1])                     # [N, H]
        logits = F.linear(hidden, self.weight)                                # [N, E]
        weights, ids = torch.topk(torch.softmax(logits.float(), -1), self.top_k, dim=-1)   # [N, K]
        return logits, weights.to(logits.dtype), ids


def plain_scores(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """PlainTopKRouter's weights of the given experts: softmax over all experts, gathered, not renormalised."""
    return torch.softmax(logits.float(), dim=-1).gather(1, ids)                # [N, K]
