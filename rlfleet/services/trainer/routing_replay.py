"""R3 routing replay: the trainer's MoE layers use the experts the rollout engine chose, not their own top-k.

Why: with near ties in the router, the trainer's forward (another batch layout, another dtype, another kernel) picks
different experts than the engine did for some tokens, and each flipped route moves that token's logprob far more
than ordinary numeric noise does; the importance ratios then explode and RL on MoE models collapses. Replaying the
rollout's routes removes that difference while the router still learns: the top-k *selection* is taken from the
recording, the top-k *weights* are recomputed from the trainer's own router logits gathered at the recorded ids,
so gradients reach the router weights exactly as they would have for those experts.

Mechanism (the model-spec contract of DESIGN.md §2, for routers): a forward hook on every router module (transformers
>= 5 names them `<Arch>TopKRouter`; each returns `(router_logits [N, E], top_k_weights [N, K], top_k_index [N, K])`)
replaces the returned weights and indices while a batch's routes are active. No library code is patched, the
state dict is unchanged (weight publishing and checkpoints see the same names), and FSDP wraps the layers as before.
How a router turns logits into top-k weights differs by architecture: ROUTER_SPECS maps router class names to a
ScoreFn; the config's model.router_scores adds others (`router_specs`), and a model spec (model.specs) may replace
a router module with one of the user's own classes, named there.

Which positions are replayed. The Sample carries T routes per response (rlfleet.sample.RoutedExperts), the routes of
the forward step that produced each response token: positions P-1 .. P+T-2 of the prompt+response row, i.e. exactly
the positions whose logits become response logprobs (rlfleet/services/rollout/engines/moe_routes.py records them). The
prompt positions 0 .. P-2 route freely. They do influence the response through attention, and recording them
would make the replay complete, but (a) the Sample's routes field is validated against the response length, so
carrying them needs a new field in rlfleet.v1.RoutedExperts; (b) they would cost P * layers * K ids per sample,
repeated group_size times for one prompt; (c) a flipped prompt route reaches the response logprobs only through
attention: on a near-tied tiny MoE in float32, replaying the response positions cuts the mean |train - rollout|
logprob gap from 0.25 to 7e-4, and replaying the prompt positions as well takes it to 6e-7 (tests/unit/
test_r3_replay.py). The routes tensor marks each position replayed or FREE, so prompt routes, once the Sample
carries them, are a change to `routes_tensor` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from rlfleet.sample import Sample

ROUTES_KEY = "routed_experts"     # TrainBatch.extras[ROUTES_KEY]: [S, L, layers, K] int16, FREE where not replayed
FREE = -1
ROUTER_SUFFIX = "TopKRouter"

# (router module, router_logits [N, E], expert ids [N, K]) -> top-k weights [N, K] as the router computes them
ScoreFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def softmax_then_topk(router: torch.nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Qwen2-MoE, Qwen3-MoE, OLMoE: softmax over all experts, keep the chosen, renormalise if norm_topk_prob."""
    weights = torch.softmax(logits.float(), dim=-1).gather(1, ids)                  # [N, K]
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def topk_then_softmax(router: torch.nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """GPT-OSS: softmax over the chosen experts' logits only."""
    return torch.softmax(logits.gather(1, ids), dim=-1)                              # [N, K]


ROUTER_SPECS: dict[str, ScoreFn] = {
    "MixtralTopKRouter": softmax_then_topk,        # always renormalises (no norm_topk_prob attribute)
    "Qwen2MoeTopKRouter": softmax_then_topk,
    "Qwen3MoeTopKRouter": softmax_then_topk,
    "OlmoeTopKRouter": softmax_then_topk,
    "GptOssTopKRouter": topk_then_softmax,
}


def router_specs(router_scores: Mapping[str, str]) -> dict[str, ScoreFn]:
    """ROUTER_SPECS plus model.router_scores (router class name -> dotted path of a ScoreFn, checked against
    rlfleet.protocols.RouterScoreFn): how the config reaches R3's router specs."""
    from rlfleet.model_specs import load_router_scores

    return {**ROUTER_SPECS, **load_router_scores(router_scores)}


def routes_tensor(samples: Sequence[Sample], seq_len: int) -> torch.Tensor | None:
    """Sample routes laid out on the prompt+response rows of a TrainBatch. -> [S, L, layers, K] int16, or None.

    Row s, position P_s - 1 + t holds response token t's routes (the position whose logits predict it); every
    other position is FREE, and so is a response token whose row is FREE_ROUTE (-1: a TITO session's tool tokens,
    which the engine never produced). None when no sample carries routes (a dense model, or an engine that records
    none).
    """
    shapes = {s.routed_experts.ids.shape[1:] for s in samples if s.routed_experts is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"samples carry routes of different [layers, top_k] shapes: {sorted(shapes)}")
    layers, k = shapes.pop()
    routes = np.full((len(samples), seq_len, layers, k), FREE, dtype=np.int16)      # [S, L, layers, K]
    for row, s in enumerate(samples):
        if s.routed_experts is None or not len(s.routed_experts.ids):    # no response token: nothing to replay
            continue
        ids = s.routed_experts.ids                                                   # [T, layers, K]
        if len(ids) != len(s.response_ids):
            raise ValueError(f"sample {s.sample_id}: {len(ids)} routes for {len(s.response_ids)} response tokens")
        if ids.size and int(ids.max()) > np.iinfo(np.int16).max:
            raise ValueError(f"sample {s.sample_id}: expert id {int(ids.max())} does not fit int16")
        start = len(s.prompt_ids) - 1                                                # predicts response token 0
        skip = max(0, -start)                                                        # empty prompt: no position
        routes[row, start + skip:start + len(ids)] = ids[skip:]
    return torch.from_numpy(routes)


@dataclass
class ReplayStats:
    """Counts over (token, MoE layer) pairs: replayed ones, and those where the trainer's own top-k chose another
    expert set than the recording (the flips replay prevents). Per-layer counts stay tensors until read, so the
    hooks never wait for the device."""

    _replayed: list[torch.Tensor] = field(default_factory=list)
    _mismatched: list[torch.Tensor] = field(default_factory=list)

    def add(self, replayed: torch.Tensor, mismatched: torch.Tensor) -> None:
        self._replayed.append(replayed.sum())
        self._mismatched.append(mismatched.sum())

    def merge(self, other: ReplayStats) -> None:
        self._replayed += other._replayed
        self._mismatched += other._mismatched

    @property
    def replayed(self) -> int:
        return int(sum(int(t) for t in self._replayed))

    @property
    def mismatched(self) -> int:
        return int(sum(int(t) for t in self._mismatched))

    def as_metrics(self) -> dict[str, float]:
        replayed = self.replayed
        return {"r3_replayed": float(replayed), "r3_route_mismatch": self.mismatched / replayed if replayed else 0.0}


class RoutingReplay:
    """Forward hooks on every router of `model`; they act only inside `replaying(routes)`.

    Construct before the model is sharded (hooks stay on the router modules FSDP wraps). `specs` maps router class
    names to ScoreFns; an MoE router with no spec is an error here, never a silent free route later.
    """

    def __init__(self, model: torch.nn.Module, specs: Mapping[str, ScoreFn] | None = None) -> None:
        specs = dict(ROUTER_SPECS if specs is None else specs)
        routers = [(n, m) for n, m in model.named_modules()
                   if type(m).__name__ in specs or type(m).__name__.endswith(ROUTER_SUFFIX)]
        if not routers:
            raise ValueError(f"trainer.routing_replay is set but {type(model).__name__} has no MoE router modules")
        unknown = sorted({type(m).__name__ for _, m in routers if type(m).__name__ not in specs})
        if unknown:
            raise ValueError(f"no routing-replay spec for {unknown}; known: {sorted(specs)}")
        self.names = [n for n, _ in routers]
        self._score_fns = [specs[type(m).__name__] for _, m in routers]
        self._routes: torch.Tensor | None = None        # [S*L, layers, K] while replaying
        self._stats = ReplayStats()                     # the open scope's
        self._total = ReplayStats()                     # since the last pop_stats()
        self._handles = [m.register_forward_hook(self._hook(i)) for i, (_, m) in enumerate(routers)]

    @property
    def num_layers(self) -> int:
        return len(self.names)

    @contextmanager
    def replaying(self, routes: torch.Tensor | None) -> Iterator[ReplayStats]:
        """Replay `routes` ([S, L, layers, K], FREE = route freely) in the forwards inside; None replays nothing."""
        if routes is not None and routes.shape[2] != self.num_layers:
            raise ValueError(f"routes have {routes.shape[2]} MoE layers, the model has {self.num_layers}")
        stats = ReplayStats()
        self._routes = None if routes is None else routes.reshape(-1, *routes.shape[2:])
        self._stats = stats
        try:
            yield stats
        finally:
            self._routes, self._stats = None, ReplayStats()
            self._total.merge(stats)

    def pop_stats(self) -> dict[str, float]:
        """Metrics over every replayed forward since the last call: r3_replayed, r3_route_mismatch."""
        total, self._total = self._total, ReplayStats()
        return total.as_metrics()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, layer: int) -> Callable[[torch.nn.Module, tuple, tuple], tuple | None]:
        def hook(router: torch.nn.Module, args: tuple, output: tuple) -> tuple | None:
            if self._routes is None:
                return None
            return self._replace(layer, router, output)
        return hook

    def _replace(self, layer: int, router: torch.nn.Module, output: tuple) -> tuple:
        logits, weights, ids = output[0], output[1], output[2]                 # [N, E], [N, K], [N, K]
        assert self._routes is not None
        if self._routes.shape[0] != ids.shape[0] or self._routes.shape[2] != ids.shape[1]:
            raise ValueError(f"router {self.names[layer]} routed {tuple(ids.shape)} tokens x experts, the batch's "
                             f"routes are {tuple(self._routes.shape[::2])}: routes must match the forward's rows")
        recorded = self._routes[:, layer].to(ids.device, torch.int64)          # [N, K]
        replay = recorded[:, 0] >= 0                                            # [N]
        new_ids = torch.where(replay[:, None], recorded, ids)                   # [N, K]
        new_weights = self._score_fns[layer](router, logits, new_ids).to(weights.dtype)
        new_weights = torch.where(replay[:, None], new_weights, weights)        # free rows: the router's own
        with torch.no_grad():
            differs = (recorded.sort(-1).values != ids.sort(-1).values).any(-1) & replay      # [N]
            self._stats.add(replay, differs)
        return (logits, new_weights, new_ids, *output[3:])
