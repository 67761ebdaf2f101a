"""R3's router specs reached from the config: a model spec puts a user's router class into a tiny MoE; routing replay
refuses a router it has no score function for, and with model.router_scores naming one it replays the recorded
experts with the weights that function gives (computed here from the router's own logits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.config import ModuleSpecConfig
from rlfleet.model_specs import apply_specs, load_specs
from rlfleet.sample import RoutedExperts, Sample
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.routing_replay import ROUTES_KEY, RoutingReplay, router_specs
from tests.support.model_spec_cases import PlainTopKRouter
from tests.support.tiny_moe import EXPERTS, LAYERS, TOP_K, build_tiny_moe

CASES = "tests.support.model_spec_cases"


def _sample(index: int, prompt: list[int], response: list[int]) -> Sample:
    rng = np.random.default_rng(index)
    ids = np.stack([np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(LAYERS)])
                    for _ in range(len(response))])                          # [T, layers, K]
    return Sample(group_id="g", index=index, group_size=2, prompt_ids=prompt, response_ids=response,
                  rollout_logprobs=[-1.0] * len(response), routed_experts=RoutedExperts(ids=ids))


def test_router_scores_from_config_drive_replay_of_a_user_router() -> None:
    model = build_tiny_moe("qwen2_moe", seed=1)
    applied = apply_specs(model, load_specs([ModuleSpecConfig(target="model.layers.*.mlp.gate",
                                                              replace=f"{CASES}:PlainTopKRouter")]))
    assert applied[0].paths == ("model.layers.0.mlp.gate", "model.layers.1.mlp.gate")
    with pytest.raises(ValueError, match=r"no routing-replay spec for \['PlainTopKRouter'\]"):
        RoutingReplay(model, router_specs({}))
    replay = RoutingReplay(model, router_specs({"PlainTopKRouter": f"{CASES}:plain_scores"}))

    samples = [_sample(i, [1, 2 + i, 3], list(range(4 + i, 9 + i))) for i in range(2)]
    batch = build_train_batch(samples, routes=True)
    flat = batch.extras[ROUTES_KEY].reshape(-1, LAYERS, TOP_K).long()        # [S*L, layers, K]
    replayed = flat[:, 0, 0] >= 0
    seen: list[tuple[torch.Tensor, ...]] = []
    routers = [m for m in model.modules() if isinstance(m, PlainTopKRouter)]
    for router in routers:
        router.register_forward_hook(lambda mod, args, out: seen.append(out[:3]))
    with torch.no_grad():
        forward_logprobs(model, batch, 1.0, replay)
    assert len(seen) == LAYERS
    for layer, (logits, weights, ids) in enumerate(seen):
        assert torch.equal(ids[replayed], flat[replayed, layer])
        want = torch.softmax(logits.float(), -1).gather(1, ids)              # not renormalised: PlainTopKRouter's
        torch.testing.assert_close(weights[replayed].float(), want[replayed])
    assert replay.pop_stats()["r3_replayed"] == float(replayed.sum() * LAYERS)
