"""Rollout side of R3: the torch engine records each token's experts (forward hooks on the routers), the routes
reach the Sample, and travel packed as uint8 / uint16."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.protocols import Generation, GroupTicket, Prompt, SamplingParams
from rlfleet.sample import RoutedExperts, Sample
from rlfleet.services.rollout.engines.moe_routes import RouteRecorder, find_routers
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.rollout_fns import single_turn
from tests.support.tiny_model import make_tiny_model
from tests.support.tiny_moe import EXPERTS, LAYERS, TOP_K, make_tiny_moe

torch.set_num_threads(1)
PROMPTS = [[1, 4, 5, 6], [2, 7], [3, 8, 9, 10, 11, 12], [1, 5], [4, 6, 6, 13, 20, 21, 22, 23, 24, 25, 26]]


def _sample(ids: np.ndarray) -> Sample:
    t = ids.shape[0]
    return Sample(group_id="g", index=0, group_size=1, prompt_ids=[1, 2], response_ids=list(range(t)),
                  rollout_logprobs=[-1.0] * t, routed_experts=RoutedExperts(ids=ids))


@pytest.mark.parametrize(("top", "bits", "width"), [(EXPERTS - 1, 8, 1), (255, 8, 1), (256, 16, 2), (65535, 16, 2)])
def test_routes_pack_to_one_or_two_bytes_per_id_and_round_trip(top: int, bits: int, width: int) -> None:
    t, layers, k = 7, 3, 4
    ids = np.random.default_rng(0).integers(0, top + 1, size=(t, layers, k))
    ids[0, 0, 0] = top                                                   # the largest id decides the width
    msg = _sample(ids).to_proto()
    assert msg.routed_experts.bits == bits
    assert len(msg.routed_experts.ids) == t * layers * k * width        # 8x / 4x smaller than int64
    back = Sample.from_proto(type(msg).FromString(msg.SerializeToString()))
    assert back.routed_experts is not None
    np.testing.assert_array_equal(back.routed_experts.ids, ids)


def test_packed_routes_are_the_size_of_the_ids_and_no_more() -> None:
    """The sample grows by exactly T * layers * K bytes (+ a few header bytes) when it carries 8-bit routes."""
    t = 64
    ids = np.random.default_rng(1).integers(0, EXPERTS, size=(t, LAYERS, TOP_K))
    with_routes = len(_sample(ids).to_proto().SerializeToString())
    without = len(dataclasses.replace(_sample(ids), routed_experts=None).to_proto().SerializeToString())
    assert t * LAYERS * TOP_K <= with_routes - without <= t * LAYERS * TOP_K + 16


def _teacher_forced_routes(model: torch.nn.Module, prompt: list[int], output: tuple[int, ...]) -> np.ndarray:
    """Routes [T, layers, K] of a full forward of prompt+output at the positions that predict each output token."""
    recorder = RouteRecorder(model)
    ids = prompt + list(output)
    with torch.no_grad():
        model(torch.tensor([ids]))
    recorder.close()
    routes = recorder.take(1, len(ids))[0]                               # [P+T, layers, K]
    return routes[len(prompt) - 1:len(ids) - 1].numpy()


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_engine_routes_equal_a_teacher_forced_forward(arch: str, tmp_path: Path) -> None:
    model_dir = make_tiny_moe(tmp_path / arch, arch=arch, seed=3)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    assert [type(m).__name__ for _, m in find_routers(hf)] == [f"{'Qwen2Moe' if arch == 'qwen2_moe' else 'Mixtral'}"
                                                               f"TopKRouter"] * LAYERS
    engine = TorchEngine(model_dir, max_batch_size=2)     # fewer slots than prompts: requests join a running batch
    try:
        futures = [engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=4 + 3 * i, seed=i))
                   for i, p in enumerate(PROMPTS)]
        gens = [f.result(timeout=120) for f in futures]
    finally:
        engine.shutdown()
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        routes = gen.routed_experts
        assert routes is not None and routes.shape == (len(gen.output_ids), LAYERS, TOP_K)
        assert routes.min() >= 0 and routes.max() < EXPERTS
        expected = _teacher_forced_routes(hf, prompt, gen.output_ids)
        np.testing.assert_array_equal(np.sort(routes, -1), np.sort(expected, -1))


def test_dense_model_records_no_routes(tmp_path: Path) -> None:
    engine = TorchEngine(make_tiny_model(tmp_path / "dense"), max_batch_size=2)
    try:
        gen = engine.submit([1, 4, 5], SamplingParams(temperature=0, max_new_tokens=3)).result(timeout=60)
    finally:
        engine.shutdown()
    assert gen.routed_experts is None and RouteRecorder.attach(engine.model) is None


class _Ctx:
    """A RolloutContext whose engine returns canned generations with routes."""

    replica_id, tokenizer, sampling, run_seed = "r0", None, SamplingParams(max_new_tokens=3), 0

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        fut: Future[Generation] = Future()
        routes: np.ndarray = np.arange(3 * LAYERS * TOP_K).reshape(3, LAYERS, TOP_K) % EXPERTS
        fut.set_result(Generation(output_ids=(5, 6, 7), logprobs=(-1.0, -2.0, -3.0), finish_reason="length",
                                  weight_version=0, routed_experts=routes))
        return fut

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return list(prompt.token_ids or ())

    def score(self, prompt: Prompt, sample: Sample) -> Sample:
        return sample


def test_single_turn_puts_the_routes_in_the_sample() -> None:
    samples = list(single_turn(_Ctx(), Prompt(index=0, token_ids=(1, 2)), GroupTicket("g", 0, 2)))
    assert len(samples) == 2
    for s in samples:
        assert s.routed_experts is not None and s.routed_experts.ids.shape == (3, LAYERS, TOP_K)
        back = Sample.from_proto(s.to_proto())                         # validated: size matches the response
        assert back.routed_experts is not None
        np.testing.assert_array_equal(back.routed_experts.ids, s.routed_experts.ids)
