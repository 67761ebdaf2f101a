"""True on-policy mode (trainer.on_policy): the built-in engine's logprobs equal the trainer's recomputation
bitwise -- continuous batching with a left-padded KV-cached decode on one side, a right-padded full-sequence FSDP
forward on the other -- over a few train / publish / generate steps of a tiny model, so logprob_abs_diff is exactly
0 and every TIS weight exactly 1. The same rollout scored with the library kernels differs (the test can fail)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.config import ConfigError, parse_config
from rlfleet.cpu_kernels.invariant_ops import batch_invariant, matmul
from rlfleet.protocols import SamplingParams, TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.step import StepContext
from tests.support.tiny_model import make_tiny_model

GROUPS, GROUP_SIZE, NEW_TOKENS, STEPS = 2, 4, 6, 3


class _Capture:
    """TrainerHooks: keep each minibatch as the loss saw it."""

    def __init__(self) -> None:
        self.minibatches: list[TrainBatch] = []

    def before_step(self, step: int, batch: TrainBatch) -> None:
        self.minibatches.append(batch)


def _rollout(engine: TorchEngine, step: int, temperature: float) -> list[list[Sample]]:
    rng = np.random.default_rng(step)
    prompts = [rng.integers(3, 19, size=int(rng.integers(2, 7))).tolist() for _ in range(GROUPS)]   # ragged
    futures = {(g, i): engine.submit(p, SamplingParams(temperature=temperature, max_new_tokens=NEW_TOKENS,
                                                       seed=100 * step + 10 * g + i))
               for g, p in enumerate(prompts) for i in range(GROUP_SIZE)}
    gens = {key: f.result(timeout=120) for key, f in futures.items()}
    return [[Sample(group_id=f"s{step}g{g}", index=i, group_size=GROUP_SIZE, prompt_ids=prompts[g],
                    response_ids=list(gens[g, i].output_ids), rollout_logprobs=list(gens[g, i].logprobs),
                    reward=float(len(gens[g, i].output_ids) % 3), weight_version=step)
             for i in range(GROUP_SIZE)] for g in range(GROUPS)]


def _valid_equal(mb: TrainBatch) -> bool:
    valid = mb.response_mask > 0
    assert mb.old_logprobs is not None
    return torch.equal(mb.old_logprobs[valid], mb.rollout_logprobs[valid])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_the_trainers_bitwise(tmp_path: Path, temperature: float) -> None:
    model_dir = make_tiny_model(tmp_path / "tiny", seed=3)
    cfg = parse_config({
        "run": {"dir": str(tmp_path / "run")}, "model": {"path": str(model_dir)},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": GROUP_SIZE,
                    "sampling": {"temperature": temperature}},
        "trainer": {"groups_per_step": GROUPS, "minibatches": 2, "lr": 3e-3, "on_policy": True}})
    engine = TorchEngine(model_dir, max_batch_size=3, dtype="float32", on_policy=True)   # rows join and leave
    init_distributed("", 0, 1, torch.device("cpu"))
    try:
        backend = FsdpBackend(cfg, 0, 1, torch.device("cpu"))
        advantage_fn, loss_fn = resolve(cfg.trainer)
        native_gaps = []
        for step in range(STEPS):
            groups = _rollout(engine, step, temperature)
            capture = _Capture()
            ctx = StepContext(advantage_fn, loss_fn, (capture,), temperature=temperature, minibatches=2,
                              grad_clip=1.0, world_size=1, device=torch.device("cpu"), pad_id=backend.pad_id)
            metrics = backend.train_step(groups, step, ctx)
            assert len(capture.minibatches) == 2
            assert all(_valid_equal(mb) for mb in capture.minibatches), step
            assert metrics["logprob_abs_diff"] == 0.0 and metrics["tis_weight_mean"] == 1.0, metrics
            assert metrics["tis_clip_fraction"] == 0.0 and metrics["ess"] == 1.0
            # the library kernels on the same rollout, the same (pre-update) weights: not bitwise
            batch = build_train_batch([s for g in groups for s in g])
            native = TorchEngine(model_dir, max_batch_size=3, dtype="float32")
            try:
                native.update_weights_from_tensor(list(engine.named_weights()), step)
                with torch.no_grad():
                    scored = forward_logprobs(native.model, batch, temperature)
            finally:
                native.shutdown()
            valid = batch.response_mask > 0
            native_gaps.append(float((scored[valid] - batch.rollout_logprobs[valid]).abs().max()))
            state = backend.full_state_dict()                         # publish: the engine takes the new weights
            engine.update_weights_from_tensor(list(state.items()), step + 1)
        assert max(native_gaps) > 0, native_gaps
    finally:
        engine.shutdown()
        leave_distributed()


def test_invariant_matmul_is_exact_under_padding_and_batching() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, 33, generator=g), torch.randn(33, 5, generator=g)
    ref = [[sum(float(a[i, k]) * float(b[k, j]) for k in range(33)) for j in range(5)] for i in range(7)]
    torch.testing.assert_close(matmul(a, b), torch.tensor(ref), atol=1e-5, rtol=0)
    padded = torch.cat([torch.zeros(7, 4), a, torch.zeros(7, 9)], 1)           # zeros left and right of K
    b_pad = torch.cat([torch.randn(4, 5, generator=g), b, torch.randn(9, 5, generator=g)])
    assert torch.equal(matmul(padded, b_pad), matmul(a, b))
    assert torch.equal(matmul(a[2:3], b), matmul(a, b)[2:3])                    # one row alone = inside a batch
    with batch_invariant():
        x = torch.randn(3, 19, generator=g)
        assert torch.equal(torch.log_softmax(x, -1)[1], torch.log_softmax(x[1], -1))
        assert torch.equal(torch.exp(x)[2, -3:], torch.exp(x[2, -3:]))          # a tensor's tail: same lanes


def test_on_policy_refuses_what_it_cannot_guarantee(tmp_path: Path) -> None:
    base = {"model": {"path": "m"}, "rollout": {"data_source": "x:y", "reward_fn": "x:y"}}
    with pytest.raises(ConfigError, match="rollout.engine"):
        parse_config({**base, "rollout": {**base["rollout"], "engine": "sglang"}, "trainer": {"on_policy": True}})
    with pytest.raises(ConfigError, match="model.dtype"):
        parse_config({**base, "model": {"path": "m", "dtype": "bfloat16"}, "trainer": {"on_policy": True}})
