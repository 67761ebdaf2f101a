"""trainer.profile's pieces without a run: the config's refusals, the trainer's StepProfiler writing only the listed
steps, and a real torch engine tracing only the profiled weight version, at most rollout_steps engine steps of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlfleet.config import ConfigError, ProfileConfig, check_trainer, load_config
from rlfleet.protocols import SamplingParams
from rlfleet.runtime.torch_profile import StepProfiler, VersionProfiler
from tests.support.runs import EXAMPLE
from tests.support.tiny_model import make_tiny_model


def _names(path: Path) -> list[str]:
    return [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_config_maps_steps_to_versions_and_refuses_what_it_cannot_trace() -> None:
    cfg = load_config(EXAMPLE, {"trainer.steps": 10, "trainer.publish_every": 2, "trainer.profile.steps": [5, 6, 5]})
    assert cfg.trainer.profile.steps == [5, 6]
    assert cfg.trainer.profile.versions(cfg.trainer.publish_every) == [2, 3]    # step // publish_every
    check_trainer(cfg)
    with pytest.raises(ConfigError, match=r"trainer.profile.steps \[10\] are beyond the run"):
        check_trainer(load_config(EXAMPLE, {"trainer.steps": 10, "trainer.profile.steps": [3, 10]}))
    with pytest.raises(ConfigError, match="trainer.profile.rollout traces the torch engine"):
        check_trainer(load_config(EXAMPLE, {"trainer.steps": 10, "trainer.profile.steps": [3],
                                            "rollout.engine": "sglang"}))
    with pytest.raises(ConfigError, match="counted from 0"):
        load_config(EXAMPLE, {"trainer.profile.steps": [-1]})


def test_step_profiler_traces_listed_steps_only(tmp_path: Path) -> None:
    profiler = StepProfiler(ProfileConfig(steps=[1]), tmp_path, rank=0, device=torch.device("cpu"))
    x = torch.randn(8, 8, requires_grad=True)
    for step in range(3):
        with profiler.step(step):
            (x @ x).sum().backward()
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["trainer-step-1-rank0.json"]
    names = _names(tmp_path / "profile" / "trainer-step-1-rank0.json")
    assert "rlfleet.trainer_step.1" in names and "aten::mm" in names


def test_engine_traces_the_profiled_version_only(tmp_path: Path) -> None:
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine

    model = make_tiny_model(tmp_path / "tiny")
    engine = TorchEngine(model, max_batch_size=4, seed=0)
    folder = tmp_path / "profile"
    try:
        engine.profile_decode(VersionProfiler(ProfileConfig(steps=[1], rollout_steps=3), [1], folder, "rollout-0",
                                              torch.device("cpu")))
        weights = [(n, t.clone()) for n, t in engine.named_weights()]
        sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=1)
        for version in range(3):
            if version:
                engine.update_weights_from_tensor(weights, version)
            engine.submit([1, 2, 3], sampling).result(timeout=60)
            if version == 0:
                assert not folder.exists()
        # version 1's trace was written once its 3 steps were done; versions 0 and 2 were never traced
        assert sorted(p.name for p in folder.iterdir()) == ["rollout-0-v1.json"]
        names = _names(folder / "rollout-0-v1.json")
        steps = names.count("rlfleet.engine.prefill") + names.count("rlfleet.engine.decode")
        assert names.count("rlfleet.engine.prefill") == 1 and 1 <= steps <= 3
        assert any(n.startswith("aten::") for n in names)
    finally:
        engine.shutdown()
