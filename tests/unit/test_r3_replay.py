"""Trainer side of R3: routes laid out on the batch, replayed in the forward (router still gets gradients), and the
must-show: on routers with near ties, replay makes the train-vs-rollout logprob gap far smaller than without."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.config import parse_config
from rlfleet.protocols import Generation, SamplingParams, TrainBatch
from rlfleet.sample import RoutedExperts, Sample
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.routing_replay import FREE, ROUTES_KEY, RoutingReplay, routes_tensor
from rlfleet.services.trainer.step import StepContext
from tests.support.tiny_moe import EXPERTS, LAYERS, TOP_K, VOCAB, build_tiny_moe, make_tiny_moe

torch.set_num_threads(1)
GROUPS, GROUP_SIZE, NEW_TOKENS = 4, 2, 16


def _routes(t: int, seed: int) -> RoutedExperts:
    rng = np.random.default_rng(seed)
    ids = np.stack([np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(LAYERS)]) for _ in range(t)])
    return RoutedExperts(ids=ids)                                          # [T, layers, K], distinct per token


def _sample(index: int, prompt: list[int], response: list[int], routes: bool = True) -> Sample:
    return Sample(group_id="g", index=index, group_size=8, prompt_ids=prompt, response_ids=response,
                  rollout_logprobs=[-1.0] * len(response),
                  routed_experts=_routes(len(response), index) if routes else None)


def test_routes_sit_at_the_positions_that_predict_each_response_token() -> None:
    samples = [_sample(0, [1, 2, 3], [4, 5]), _sample(1, [7], [8, 9, 10, 11]), _sample(2, [], [3, 4]),
               _sample(3, [1, 2], [5], routes=False)]
    routes = routes_tensor(samples, seq_len=5)                              # [S, L, layers, K]
    assert routes is not None and routes.shape == (4, 5, LAYERS, TOP_K) and routes.dtype == torch.int16
    free = torch.full((LAYERS, TOP_K), FREE, dtype=torch.int16)
    for row, s in enumerate(samples):
        for pos in range(5):
            t = pos - (len(s.prompt_ids) - 1)                              # response token predicted at pos
            if s.routed_experts is not None and 0 <= t < len(s.response_ids):
                assert routes[row, pos].tolist() == s.routed_experts.ids[t].tolist(), (row, pos)
            else:
                assert torch.equal(routes[row, pos], free), (row, pos)
    assert routes_tensor([_sample(0, [1], [2], routes=False)], 2) is None
    batch = build_train_batch(samples, routes=True)
    assert torch.equal(batch.extras[ROUTES_KEY], routes)
    assert ROUTES_KEY not in build_train_batch(samples).extras          # only when the trainer replays


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_replay_uses_the_recorded_experts_and_the_router_still_learns(arch: str) -> None:
    model = build_tiny_moe(arch, seed=1).train()
    samples = [_sample(i, [1, 2 + i, 3], list(range(4 + i, 10 + 2 * i))) for i in range(3)]
    batch = build_train_batch(samples, routes=True)
    routes = batch.extras[ROUTES_KEY]                                       # [S, L, layers, K]
    with torch.no_grad():
        seen_free = _router_outputs(model, batch, None)
    replay = RoutingReplay(model)
    seen = _router_outputs(model, batch, replay, backward=True)
    flat = routes.reshape(-1, LAYERS, TOP_K).long()                         # [S*L, layers, K]
    replayed = flat[:, 0, 0] >= 0
    for layer, (logits, weights, ids) in enumerate(seen):
        assert torch.equal(ids[replayed], flat[replayed, layer])           # recorded experts, in recorded order
        assert torch.equal(ids[~replayed], seen_free[layer][2][~replayed])  # prompt and padding route freely
        probs = torch.softmax(logits.detach().float(), -1).gather(1, ids)  # weights: the trainer's own router
        if arch == "mixtral":                                               # probabilities at the recorded ids
            probs = probs / probs.sum(-1, keepdim=True)
        torch.testing.assert_close(weights.detach().float(), probs)
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopKRouter"):
            assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0, name
            assert torch.isfinite(module.weight.grad).all(), name
    assert replay.pop_stats()["r3_replayed"] == float(replayed.sum() * LAYERS)


def _router_outputs(model: torch.nn.Module, batch: TrainBatch, replay: RoutingReplay | None,
                    backward: bool = False) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """What each MoE layer's experts received: (router_logits, top_k_weights, top_k_index) per layer."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = [m.register_forward_hook(lambda mod, args, out: seen.append(out[:3])) for m in routers]
    try:
        logprobs = forward_logprobs(model, batch, 1.0, replay)
        if backward:
            (logprobs * batch.response_mask).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return seen


# ---- the must-show --------------------------------------------------------------------------------------------


def _recorded_routes(gen: Generation) -> np.ndarray:
    assert gen.routed_experts is not None, "the engine recorded no routes"
    return gen.routed_experts


def _rollout(model_dir: Path) -> list[Sample]:
    """GROUPS x GROUP_SIZE sampled responses from the torch engine in float32, routes recorded."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(1, VOCAB, size=int(rng.integers(3, 7))).tolist() for _ in range(GROUPS)]
    engine = TorchEngine(model_dir, max_batch_size=3, dtype="float32")     # continuous batching, KV cache
    try:
        futures = {(g, i): engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=10 * g + i))
                   for g, p in enumerate(prompts) for i in range(GROUP_SIZE)}
        gens = {key: f.result(timeout=120) for key, f in futures.items()}
    finally:
        engine.shutdown()
    return [Sample(group_id=f"g{g}", index=i, group_size=GROUP_SIZE, prompt_ids=prompts[g],
                   response_ids=list(gen.output_ids), rollout_logprobs=list(gen.logprobs), reward=float(i),
                   routed_experts=RoutedExperts(ids=_recorded_routes(gen))) for (g, i), gen in gens.items()]


def _gap(logprobs: torch.Tensor, batch: TrainBatch) -> float:
    """mean |train - rollout| logprob over response tokens."""
    mask = batch.response_mask
    return float(((logprobs.float() - batch.rollout_logprobs).abs() * mask).sum() / mask.sum())


def _with_prompt_routes(routes: torch.Tensor, samples: list[Sample], model_dir: Path) -> torch.Tensor:
    """routes [S, L, layers, K] plus prompt positions 0..P-2 routed by a float32 prefill of each prompt (what the
    engine's prefill computes; the Sample does not carry these)."""
    from transformers import AutoModelForCausalLM

    from rlfleet.services.rollout.engines.moe_routes import RouteRecorder

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    recorder = RouteRecorder(hf)
    full = routes.clone()
    for row, s in enumerate(samples):
        with torch.no_grad():
            hf(torch.tensor([s.prompt_ids]))
        full[row, :len(s.prompt_ids) - 1] = recorder.take(1, len(s.prompt_ids))[0, :-1].to(torch.int16)
    return full


@pytest.mark.parametrize(("path", "tie_eps"), [("fp32, other batch layout, no KV cache", 1e-6), ("bf16", 1e-2)])
def test_replay_closes_the_train_rollout_gap_on_near_tied_routers(path: str, tie_eps: float, tmp_path: Path) -> None:
    """Rollout: float32 engine (left-padded prefill, KV-cached decode). Trainer: one right-padded batch forward, in
    float32 or in bfloat16. The routers have near ties, so the trainer's own top-k flips some routes."""
    model_dir = make_tiny_moe(tmp_path / "moe", seed=0, tie_eps=tie_eps)
    samples = _rollout(model_dir)
    model = build_tiny_moe(seed=0, tie_eps=tie_eps)
    if path == "bf16":
        model = copy.deepcopy(model).to(torch.bfloat16)
    replay = RoutingReplay(model)
    batch = build_train_batch(samples, routes=True)
    with torch.no_grad():
        without = _gap(forward_logprobs(model, batch, 1.0), batch)
        with_replay = _gap(forward_logprobs(model, batch, 1.0, replay), batch)
        stats = replay.pop_stats()
        batch.extras[ROUTES_KEY] = _with_prompt_routes(batch.extras[ROUTES_KEY], samples, model_dir)
        with_prompts = _gap(forward_logprobs(model, batch, 1.0, replay), batch)
    print(f"\nR3 [{path}, tie_eps={tie_eps}]: mean |train - rollout| logprob without replay {without:.3g}, "
          f"with replay {with_replay:.3g} (x{with_replay / without:.3g}), replaying prompt positions too "
          f"{with_prompts:.3g}; routes the trainer flips without replay: {stats['r3_route_mismatch']:.1%} of "
          f"{stats['r3_replayed']:.0f} (token, layer)")
    assert stats["r3_route_mismatch"] > 0.01                       # near ties really flip routes without replay
    assert with_replay < 0.2 * without                             # and replay removes most of the gap
    # what remains: fp32, the prompt positions' own flips (they route freely); bf16, bfloat16 rounding itself
    assert with_prompts <= with_replay * 1.05
    if path.startswith("fp32"):
        assert with_replay < 0.02 * without and with_prompts < 1e-5


class _Capture:
    """TrainerHooks: keep each minibatch as the loss saw it."""

    def __init__(self) -> None:
        self.minibatches: list[TrainBatch] = []

    def before_step(self, step: int, batch: TrainBatch) -> None:
        self.minibatches.append(batch)


def test_fsdp_backend_replays_when_configured(tmp_path: Path) -> None:
    """trainer.routing_replay: true through FsdpBackend.train_step (1 rank, 2 minibatches): the old logprobs match
    the rollout's, the metrics report the flips replay prevented; false: the gap is back."""
    model_dir = make_tiny_moe(tmp_path / "moe", seed=0, tie_eps=1e-6)
    samples = _rollout(model_dir)
    groups = [[s for s in samples if s.group_id == f"g{g}"] for g in range(GROUPS)]
    init_distributed("", 0, 1, torch.device("cpu"))
    try:
        gaps, metrics = {}, {}
        for on in (True, False):
            cfg = parse_config({
                "run": {"dir": str(tmp_path / f"run{on}")}, "model": {"path": str(model_dir)},
                "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": GROUP_SIZE},
                "trainer": {"groups_per_step": GROUPS, "minibatches": 2, "lr": 1e-4, "routing_replay": on}})
            backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
            assert (backend.routing_replay is not None) == on
            advantage_fn, loss_fn = resolve(cfg.trainer)
            capture = _Capture()
            ctx = StepContext(advantage_fn, loss_fn, (capture,), temperature=1.0, minibatches=2, grad_clip=1.0,
                              world_size=1, device=torch.device("cpu"), pad_id=backend.pad_id)
            metrics[on] = backend.train_step(groups, 0, ctx)
            assert len(capture.minibatches) == 2
            gaps[on] = np.mean([_gap(mb.old_logprobs, mb) for mb in capture.minibatches])
    finally:
        leave_distributed()
    print(f"\nR3 via FsdpBackend: |old - rollout| logprob with replay {gaps[True]:.3g}, without {gaps[False]:.3g}; "
          f"r3_route_mismatch {metrics[True]['r3_route_mismatch']:.1%}")
    assert metrics[True]["r3_replayed"] > 0 and metrics[True]["r3_route_mismatch"] > 0
    assert "r3_replayed" not in metrics[False]
    assert gaps[True] < 0.02 * gaps[False]
