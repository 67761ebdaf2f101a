"""The rendered chart played as containers (scripts/chart_play.sh): a short run of the addition example under mTLS
with Secrets made beforehand, Redis from the chart and the chart's volumes, during which the buffer's container is
killed with SIGKILL and a rollout pod is cut off the network for longer than its lease. The run must finish with
every sample accounted for: the ledger (tests/faults/ledger.py) finds none lost and none trained twice, every step
trained the batch size the run config asks for, both events recovered, and held-out before/after is printed.

The model is the random tiny llama (examples.addition.warm_start:random_start): the supervised warm start takes
minutes on a busy CPU and tests nothing here; `bash scripts/chart_play.sh` plays the whole example.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster.chart import ROOT, VALUES
from tests.cluster.tools import need_binary, need_module

pytestmark = pytest.mark.chart_play

STEPS = 40
LEASE_S = 6


def test_a_played_run_survives_a_killed_buffer_and_a_partitioned_replica(tmp_path: Path) -> None:
    need_module("helm_python")
    need_binary("podman")
    values = yaml.safe_load((VALUES / "play-cpu.yaml").read_text())["runConfig"]
    groups, group_size = 8, int(values["rollout"]["group_size"])
    sets = {"runConfig.model.prepare": "examples.addition.warm_start:random_start",
            "runConfig.trainer.steps": STEPS, "runConfig.trainer.groups_per_step": groups,
            "runConfig.rollout.claim_groups": groups, "runConfig.buffer.lease_seconds": LEASE_S,
            "runConfig.eval.every_steps": STEPS, "runConfig.eval.max_prompts": 32}
    cmd = ["bash", str(ROOT / "scripts" / "chart_play.sh"), "--ops", "kill-buffer,partition", "--work", str(tmp_path)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert outcome["lost"] == 0 and outcome["trained_twice"] == 0 and not outcome["unexpected"], outcome["ledger"]
    assert outcome["steps"] == list(range(STEPS))
    assert outcome["trained"] == STEPS * groups * group_size          # every step a full batch, each id once
    assert outcome["put"] >= outcome["trained"]
    assert [e["kind"] for e in outcome["events"]] == ["kill-buffer", "partition"]
    for e in outcome["events"]:
        assert e["serving_s"] is not None and e["next_step_s"] is not None, e
    assert "held-out greedy" in out and "eval_before" in outcome["summary"]
    leftovers = subprocess.run(["podman", "ps", "-a", "--filter", "label=io.rlfleet.play.release", "--format",
                                "{{.Names}}"], capture_output=True, text=True, check=False,
                               env={**os.environ, "CONTAINERS_CONF": str(ROOT / "docker/podman/containers.conf")})
    assert leftovers.stdout.split() == [], "the played release was not torn down"
