"""`rlfleet run` on the addition example through all four services: the model learns, sync and async."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.support.runs import failure_report, run_rlfleet, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


# Sync runs are deterministic on one machine. Async ones are not: which weight version generated each sample depends
# on timing, so each run follows its own trajectory, and the greedy held-out accuracy of one snapshot swings by
# several points from one evaluation to the next. So the async run trains 150 steps of 32 groups (the example's
# batch: less gradient noise), is evaluated every 25 steps, and the mean of its last three evaluations (steps 100,
# 125, 150) must be 3 points up. The warm start is trained to a target accuracy (examples/addition/warm_start.py):
# with the earlier fixed 400 steps it started at 0.082 on one CPU type (0.318 on another), and these margins then
# hinged on luck (+3.0 points sync at 100 steps, a 30-step DAPO run +2.4). From the target's warm start (0.354 on
# this 2-core AMD box): sync +22.8 points at 100 steps, async evaluations from step 100 on +25.4 to +32.0.
STEPS = {0: 100, 2: 150}
GROUPS = {0: 16, 2: 32}
EVAL_EVERY = {0: 0, 2: 25}


def heldout_evaluations(run_dir: Path) -> dict[int, float]:
    """step -> held-out greedy accuracy, from the trainer's metrics."""
    rows = [json.loads(line) for line in (run_dir / "metrics" / "trainer.jsonl").read_text().splitlines()]
    return {int(r["step"]): float(r["eval/reward_mean"]) for r in rows if "eval/reward_mean" in r}


@pytest.mark.parametrize("staleness", [0, 2])
def test_rl_raises_heldout_accuracy(tmp_path: Path, warm_model: Path, staleness: int) -> None:
    run_dir = tmp_path / "run"
    steps = STEPS[staleness]
    result = run_rlfleet(run_dir, warm_model, {"trainer.steps": steps, "trainer.groups_per_step": GROUPS[staleness],
                                               "buffer.max_staleness": staleness,
                                               "eval.every_steps": EVAL_EVERY[staleness],
                                               "eval.max_prompts": 500, "trainer.checkpoint_every": 50})
    assert result.returncode == 0, failure_report(result, run_dir)
    s = summary(run_dir)
    assert s["steps"] == steps
    if staleness == 0:
        assert s["eval_after"] >= s["eval_before"] + 0.03, s
    else:
        evals = heldout_evaluations(run_dir)
        assert sorted(evals) == [0, 25, 50, 75, 100, 125, 150], evals
        assert evals[0] == s["eval_before"] and evals[150] == s["eval_after"], (evals, s)
        late = statistics.mean(evals[k] for k in (100, 125, 150))
        assert late >= s["eval_before"] + 0.03, (late, evals)
    assert "held-out greedy" in result.stderr
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "metrics" / "trainer.jsonl").exists()
    buffer = s["buffer"]
    assert buffer["acked_samples"] >= steps * GROUPS[staleness] * 8 - sum(buffer["dropped"].values())
