"""`rlfleet run` on the addition example with each algorithm preset: DAPO (with the buffer's dynamic-sampling
filter), GSPO and REINFORCE++ raise held-out accuracy (GRPO, the example's own algorithm, is test_addition_run's);
PPO trains with its critic; a LoRA run learns while publishing adapter weights only. About 1 s per step on this
machine; the whole file stays under ~5 minutes."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from rlfleet.metrics import read_jsonl
from tests.support.runs import failure_report, run_rlfleet, summary

pytestmark = pytest.mark.slow

STEPS = 30
BASE = {"trainer.steps": STEPS, "eval.every_steps": 0, "trainer.checkpoint_every": STEPS}
PUBLISHED = re.compile(r"published version (\d+) \(step \d+, \w+, (\d+) tensors, (\d+) bytes\)")


def _run(tmp_path: Path, warm_model: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, warm_model, {**BASE, **overrides})
    assert result.returncode == 0, failure_report(result, run_dir)
    return {"run_dir": run_dir, **summary(run_dir)}


@pytest.mark.parametrize("algorithm,extra", [
    ("dapo", {"buffer.filters": ["dynamic_sampling"]}),
    ("gspo", {}),
    ("reinforce_pp", {}),
])
def test_algorithm_raises_heldout_accuracy(tmp_path: Path, warm_model: Path, algorithm: str,
                                           extra: dict[str, Any]) -> None:
    s = _run(tmp_path, warm_model, {"trainer.algorithm": algorithm, **extra})
    assert s["steps"] == STEPS
    assert s["eval_after"] > s["eval_before"] + 0.03, s
    if algorithm == "dapo":
        assert s["buffer"]["dropped"].get("filtered", 0) > 0, s["buffer"]     # dynamic sampling dropped groups


def test_ppo_trains_with_a_critic(tmp_path: Path, warm_model: Path) -> None:
    s = _run(tmp_path, warm_model, {"trainer.algorithm": "ppo", "trainer.steps": 8, "trainer.checkpoint_every": 8,
                                    "trainer.critic.lr": 1e-3})
    steps = [r for r in read_jsonl(s["run_dir"] / "metrics" / "trainer.jsonl") if "loss" in r]
    assert len(steps) == 8
    assert all(math.isfinite(r["value_loss"]) and "return_mean" in r for r in steps)
    assert steps[0]["value_mean"] == 0.0                      # the value head starts at zero ...
    assert steps[-1]["value_mean"] != 0.0                     # ... and the critic trains
    assert s["eval_after"] >= s["eval_before"] - 0.05, s


def test_lora_learns_and_publishes_adapters_only(tmp_path: Path, warm_model: Path) -> None:
    # 50 steps, not 30: rank-8 adapters learn more slowly; at 30 steps this run gained exactly 2.0 points (one
    # standard error on 500 prompts), at 50 steps 3.2 (measured with the code of f686c82 and of this commit alike)
    steps = 50
    s = _run(tmp_path, warm_model, {"trainer.lora.rank": 8, "trainer.lora.alpha": 16, "trainer.lr": 3e-3,
                                    "trainer.steps": steps, "trainer.checkpoint_every": steps})
    assert s["eval_after"] > s["eval_before"] + 0.02, s
    log = (s["run_dir"] / "logs" / "weight_sync.log").read_text()
    published = [(int(v), int(n), int(b)) for v, n, b in PUBLISHED.findall(log)]
    assert len(published) == steps + 1
    # 4 layers x q/k/v/o x (A, B): 32 tensors of rank 8, a few % of the model's bytes
    assert {n for _, n, _ in published} == {32}
    assert max(b for _, _, b in published) < 200_000
