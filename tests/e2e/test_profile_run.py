"""trainer.profile on a real run: the listed step's trainer trace and the replica's decode trace of the weight version
that step trains from are written under RUN_DIR/profile/, open as Chrome trace JSON with the step's and the decode's
events, and no other step or version is traced. The same run carries a model spec (examples/model_specs/), so it also
shows the trainer and the replica processes both applying it at start-up and the run training through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.runs import EXAMPLE, failure_report, run_rlfleet, summary
from tests.support.tiny_model import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _events(path: Path) -> list[dict[str, Any]]:
    trace = json.loads(path.read_text())            # what chrome://tracing and Perfetto read
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def test_profile_steps_write_chrome_traces_of_step_and_decode(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, model, {
        "trainer.steps": 3, "trainer.groups_per_step": 2, "rollout.group_size": 4, "rollout.claim_groups": 2,
        "trainer.checkpoint_every": 10, "eval.data_source": None, "model.prepare": None, "trainer.profile.steps": [1],
        "trainer.profile.rollout_steps": 8,
        "model.specs": [{"target": "model.layers.*.mlp", "replace": "examples.model_specs.plain_mlp:PlainMlp"}]},
        config=EXAMPLE, timeout=500)
    assert result.returncode == 0, failure_report(result, run_dir)
    assert summary(run_dir)["steps"] == 3
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    spec_line = f"model.specs[0]: examples.model_specs.plain_mlp:PlainMlp replaced {layers} module(s) at " \
        "model.layers.*.mlp"
    for log in ("trainer-0.log", "rollout-0.log"):
        assert spec_line in (run_dir / "logs" / log).read_text(), log

    folder = run_dir / "profile"
    # step 1 trains from version 1 (publish_every 1): exactly these two traces, nothing for steps 0 and 2
    assert sorted(p.name for p in folder.iterdir()) == ["rollout-0-v1.json", "trainer-step-1-rank0.json"]

    step = _events(folder / "trainer-step-1-rank0.json")
    names = {e["name"] for e in step}
    assert {"rlfleet.trainer_step.1", "rlfleet.train_step", "rlfleet.publish"} <= names
    assert any(n.startswith("aten::") for n in names)                # the step's own ops
    assert any("backward" in n.lower() for n in names)               # its backward pass

    decode = _events(folder / "rollout-0-v1.json")
    names = {e["name"] for e in decode}
    assert "rlfleet.engine.decode" in names
    assert sum(e["name"] == "rlfleet.engine.decode" for e in decode) <= 8     # trainer.profile.rollout_steps
    assert any(n.startswith("aten::") for n in names)
