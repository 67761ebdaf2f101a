"""Applying a published weight version: verified, loaded, digest recomputed, acked; failures keep the old version."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout import weight_updates
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.weight_sync.transports.manifest import digest_of, tensor_xxh64
from rlfleet.v1 import weights_pb2
from rlfleet.weights.dtypes import dtype_name
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("models")
    return make_tiny_model(base / "v0", seed=0), make_tiny_model(base / "v1", seed=1)


@pytest.fixture
def engine(dirs: tuple[Path, Path]):
    eng = TorchEngine(dirs[0], max_batch_size=4)
    yield eng
    eng.shutdown()


def published(model_dir: Path, version: int) -> tuple[weights_pb2.WeightManifest, list[tuple[str, torch.Tensor]]]:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    tensors = [(n, t.detach().clone()) for n, t in model.state_dict().items()]
    entries = [weights_pb2.TensorEntry(name=n, dtype=dtype_name(t.dtype), shape=list(t.shape), xxh64=tensor_xxh64(t),
                                       nbytes=t.numel() * t.element_size()) for n, t in tensors]
    return weights_pb2.WeightManifest(version=version, transport="test", tensors=entries,
                                      digest=digest_of(tensors)), tensors


def test_update_applies_and_acks_the_manifest_digest(engine: TorchEngine, dirs: tuple[Path, Path]) -> None:
    manifest, tensors = published(dirs[1], version=1)
    calls: list[tuple[str, str | None, str]] = []
    acks: list[weights_pb2.UpdateResult] = []

    def receivers(transport: str):
        def fetch(m, token, timeout, replica_id):
            calls.append((transport, token, replica_id))
            return [(n, t.clone()) for n, t in tensors]
        return fetch

    updater = WeightUpdater(engine, "r0", "tok", 5.0, receivers=receivers, ack=acks.append)
    result = updater.apply(manifest)
    assert result.ok and result.version == 1 and result.digest == manifest.digest and result.bytes > 0
    assert acks == [result] and calls == [("test", "tok", "r0")]
    assert engine.weight_version == 1 and engine.submit([1, 4], GREEDY).result(60).weight_version == 1


def test_unreachable_data_plane_is_retried_with_waits_then_reported(engine: TorchEngine, dirs: tuple[Path, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, _ = published(dirs[1], version=1)
    before = engine.submit([1, 4, 5], GREEDY).result(60)
    attempts: list[float] = []
    monkeypatch.setattr(weight_updates, "TRANSFER_RETRY_WAITS", (0.05, 0.1, 0.2))

    def fetch(m, token, timeout, replica_id):
        attempts.append(time.monotonic())
        raise ConnectionError("data plane unreachable")

    acks: list[weights_pb2.UpdateResult] = []
    result = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda t: fetch, ack=acks.append).apply(manifest)
    assert len(attempts) == 4
    gaps = [b - a for a, b in zip(attempts[:-1], attempts[1:], strict=True)]
    assert all(gap >= wait for gap, wait in zip(gaps, (0.05, 0.1, 0.2), strict=True)), gaps
    assert not result.ok and result.version == 0 and "data plane unreachable" in result.error and acks == [result]
    assert engine.weight_version == 0 and engine.submit([1, 4, 5], GREEDY).result(60) == before


def test_tampered_tensors_never_reach_the_engine(engine: TorchEngine, dirs: tuple[Path, Path]) -> None:
    manifest, tensors = published(dirs[1], version=1)
    snapshot = {n: t.clone() for n, t in engine.named_weights()}

    def fetch(m, token, timeout, replica_id):
        bad = [(n, t.clone()) for n, t in tensors]
        bad[0][1].view(-1)[0] += 1.0
        return bad

    result = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda t: fetch).apply(manifest)
    assert not result.ok and "digest" in result.error and engine.weight_version == 0
    assert all(torch.equal(t, snapshot[n]) for n, t in engine.named_weights())


def test_a_transfer_that_recovers_within_the_waits_is_applied(engine: TorchEngine, dirs: tuple[Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, tensors = published(dirs[1], version=1)
    monkeypatch.setattr(weight_updates, "TRANSFER_RETRY_WAITS", (0.01, 0.01, 0.01))
    attempts: list[int] = []

    def fetch(m, token, timeout, replica_id):             # a new trainer pod's name resolves on the third try
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("errors resolving the trainer's name")
        return [(n, t.clone()) for n, t in tensors]

    result = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda t: fetch).apply(manifest)
    assert result.ok and len(attempts) == 3 and engine.weight_version == 1


def test_any_other_failure_is_retried_once(engine: TorchEngine, dirs: tuple[Path, Path]) -> None:
    manifest, _ = published(dirs[1], version=1)
    attempts: list[int] = []

    def fetch(m, token, timeout, replica_id):
        attempts.append(1)
        raise ValueError("not a transfer error")

    result = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda t: fetch).apply(manifest)
    assert not result.ok and len(attempts) == 2 and engine.weight_version == 0
