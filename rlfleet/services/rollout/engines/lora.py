"""Applying LoRA adapter versions to an engine: W = W_base + (alpha / r) * B @ A for every adapted Linear.

An adapter-only manifest (manifest.adapter_only, options rank / alpha / targets) carries `<module>.lora_A` [r, in]
and `<module>.lora_B` [out, r] tensors only. The merger keeps a copy of each base weight it touches the first time,
so every version is merged onto the original base (never onto the previous merge), and loads the merged weights
through the engine's ordinary `update_weights_from_tensor`. What the replica "holds" for the digest is the adapter
tensors it applied.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rlfleet.services.rollout.engines.base import EngineError, WeightLoadTarget
from rlfleet.services.weight_sync.transports.manifest import digest_of


def parse_options(options: Mapping[str, str]) -> tuple[int, float]:
    """(rank, alpha) from manifest options; EngineError when missing or wrong."""
    try:
        rank, alpha = int(options["rank"]), float(options["alpha"])
    except (KeyError, ValueError) as exc:
        raise EngineError(f"adapter-only manifest without valid rank/alpha options: {dict(options)}") from exc
    if rank < 1:
        raise EngineError(f"adapter rank {rank} < 1")
    return rank, alpha


def pair_adapters(named: list[tuple[str, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module name -> (A [r, in], B [out, r]); EngineError on a stray or unpaired tensor."""
    tensors = dict(named)
    pairs = {}
    for name in tensors:
        if name.endswith(".lora_A"):
            prefix = name[: -len(".lora_A")]
            if prefix + ".lora_B" not in tensors:
                raise EngineError(f"adapter {prefix}: lora_A without lora_B")
            pairs[prefix] = (tensors[name], tensors[prefix + ".lora_B"])
        elif not name.endswith(".lora_B"):
            raise EngineError(f"adapter-only update names a non-adapter tensor '{name}'")
    if len(pairs) * 2 != len(tensors):
        raise EngineError("adapter-only update: lora_B without lora_A")
    return pairs


class LoraMerger:
    """Merges adapter versions into one engine's weights, keeping the base copies."""

    def __init__(self, engine: WeightLoadTarget) -> None:
        self.engine = engine
        self.base: dict[str, torch.Tensor] = {}          # weight name -> original base weight (CPU copy)
        self.adapters: list[tuple[str, torch.Tensor]] = []

    def merged(self, named: list[tuple[str, torch.Tensor]], options: Mapping[str, str]
               ) -> list[tuple[str, torch.Tensor]]:
        """The full weights W_base + scale * B @ A of every adapted module, in the engine's dtype."""
        rank, alpha = parse_options(options)
        scale = alpha / rank
        pairs = pair_adapters(named)
        held = dict(self.engine.named_weights())
        out = []
        for prefix, (a, b) in pairs.items():
            wname = f"{prefix}.weight"
            if wname not in held:
                raise EngineError(f"adapter {prefix}: the engine holds no '{wname}'")
            if wname not in self.base:
                self.base[wname] = held[wname].detach().to("cpu", copy=True)
            base = self.base[wname]
            if a.shape[0] != rank or b.shape[1] != rank or (b.shape[0], a.shape[1]) != tuple(base.shape):
                raise EngineError(f"adapter {prefix}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit "
                                  f"rank {rank} and weight {tuple(base.shape)}")
            w = base.float() + scale * (b.float() @ a.float())                       # [out, in]
            out.append((wname, w.to(base.dtype)))
        return out

    def record(self, named: list[tuple[str, torch.Tensor]]) -> str:
        """Remember the adapters now merged; returns their digest (what this replica holds)."""
        self.adapters = [(n, t.detach().clone()) for n, t in named]
        return digest_of(self.adapters)

    def apply(self, named: list[tuple[str, torch.Tensor]], options: Mapping[str, str], version: int) -> str:
        """Merge and load one adapter version; returns the digest of the adapters now applied."""
        self.engine.update_weights_from_tensor(self.merged(named, options), version)
        return self.record(named)
