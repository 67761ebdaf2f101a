"""Record which experts each MoE layer chose, with forward hooks on the router modules (R3 routing replay, rollout).

In transformers >= 5 every MoE architecture routes through a module named `<Arch>TopKRouter` (the `gate` of its
sparse MoE block) whose forward returns `(router_logits [N, E], top_k_weights [N, K], top_k_index [N, K])` for the
N = batch * length tokens of one forward pass. A forward hook on each router keeps the index tensor of the latest
pass; nothing in the library is patched and the model computes exactly what it computes without the hooks.

What the engine keeps per generated token: the routes of the forward step that *produced* it. Output token t is
sampled from the logits at input position P - 1 + t (the last prompt token for t = 0, output token t - 1 after
that), so `Generation.routed_experts[t]` holds the expert ids every MoE layer chose at that position. These are
exactly the positions whose logits the trainer turns into response logprobs, and there are T of them, the length
`rlfleet.sample.RoutedExperts` carries. See rlfleet/services/trainer/routing_replay.py for how the trainer uses them and
why the other prompt positions route freely.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ROUTER_SUFFIX = "TopKRouter"


def find_routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The MoE router modules of a transformers model in layer order (module registration order); [] when dense."""
    return [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith(ROUTER_SUFFIX)]


class RouteRecorder:
    """Forward hooks on a model's routers that keep the top-k expert ids of the latest forward pass.

    Call `take` after each forward; the hooks only hold references, so a forward nobody takes costs nothing.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        routers = find_routers(model)
        if not routers:
            raise ValueError(f"{type(model).__name__} has no {ROUTER_SUFFIX} modules: not a transformers MoE model")
        self.names = [name for name, _ in routers]
        self.top_k = int(getattr(routers[0][1], "top_k", 0))
        self._ids: list[torch.Tensor | None] = [None] * len(routers)
        self._handles = [module.register_forward_hook(self._hook(i)) for i, (_, module) in enumerate(routers)]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouteRecorder | None:
        """A recorder for an MoE model, None for a dense one."""
        return cls(model) if find_routers(model) else None

    @property
    def num_layers(self) -> int:
        return len(self._ids)

    def _hook(self, layer: int) -> Callable[[torch.nn.Module, tuple, tuple], None]:
        def hook(module: torch.nn.Module, args: tuple, output: tuple) -> None:
            self._ids[layer] = output[2]                                  # top_k_index: [N, K]
        return hook

    def take(self, batch: int, length: int) -> torch.Tensor:
        """Expert ids of the last forward as int64 on CPU: [batch, length, num_layers, K]. Clears what it returns."""
        recorded = [t for t in self._ids if t is not None]
        missing = [self.names[i] for i, ids in enumerate(self._ids) if ids is None]
        if missing:
            raise RuntimeError(f"no routes recorded for {missing[0]} in the last forward pass")
        ids = torch.stack([t.reshape(batch, length, -1) for t in recorded], dim=2)   # [B, Lq, layers, K]
        self._ids = [None] * len(self._ids)
        return ids.to("cpu", torch.int64)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
