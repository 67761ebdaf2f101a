"""The end-of-run summary counts a resumed run's surviving lineage: steps trained again after a resume count once
(their last records), and samples/s is this invocation's samples over this invocation's wall time.

Found in a run (2026-12-02): a 30-step run that died at its step-29 checkpoint and resumed from step 14 reported
"44 steps, 1408 samples in 390s (3.6 samples/s)" — 14 steps counted twice and the first attempt's samples divided by
the resumed attempt's wall time.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlfleet.local.report import format_summary, summarize


def _step(step: int, t: float, reward: float) -> dict[str, float]:
    return {"time": t, "step": step, "loss": 0.1, "samples": 32, "reward_mean": reward, "truncation_rate": 0.0,
            "equal_reward_groups": 0.0, "response_length_mean": 10.0}


def test_a_resumed_run_counts_each_step_once_and_its_own_throughput(tmp_path: Path) -> None:
    path = tmp_path / "trainer.jsonl"
    first = [_step(s, 1000.0 + 20 * s, 0.1) for s in range(10)]          # died after step 9; checkpoint at step 4
    resumed = [_step(s, 2000.0 + 20 * (s - 5), 0.5) for s in range(5, 10)]  # resumed: steps 5-9 trained again
    evals = [{"time": 999.0, "step": 0, "eval/pass_rate": 0.2}, {"time": 2100.0, "step": 10, "eval/pass_rate": 0.4}]
    path.write_text("".join(json.dumps(r) + "\n" for r in [evals[0], *first, *resumed, evals[1]]))
    s = summarize(path, wall_seconds=200.0, buffer_stats=None, now=2150.0)    # this invocation began at 1950
    assert (s["steps"], s["samples_trained"], s["steps_retrained"]) == (10, 320, 5)
    assert s["samples_per_s"] == 5 * 32 / 200.0
    assert s["reward_last"] == 0.5 and s["reward_first"] == 0.1           # the last step is the resumed record
    assert (s["eval_before"], s["eval_after"]) == (0.2, 0.4)
    text = format_summary(s, tmp_path)
    assert text.splitlines()[0] == ("run finished: 10 steps, 320 samples (5 steps trained again after a resume); "
                                    "this run 200s (0.8 samples/s)")


def test_a_run_without_resume_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "trainer.jsonl"
    path.write_text("".join(json.dumps(_step(s, 100.0 + s, 0.1 * s)) + "\n" for s in range(4)))
    s = summarize(path, wall_seconds=10.0, buffer_stats=None, now=110.0)
    assert (s["steps"], s["samples_trained"], s["steps_retrained"], s["samples_per_s"]) == (4, 128, 0, 12.8)
    assert format_summary(s, tmp_path).splitlines()[0] == "run finished: 4 steps, 128 samples; this run 10s (12.8 " \
                                                          "samples/s)"
