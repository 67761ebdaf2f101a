"""What a new user meets on one short run of the addition example (issue 43): progress lines during the evaluation
before training; `rlfleet scale` saying that the replica it adds cannot get work, and what would let it; Ctrl-C
naming what was saved and the exact resume command, which then resumes from the step it names; the held-out rows and
a predictions file per evaluation, whose rewards are the example's reward of each completion; the summary's Wilson
95% intervals, checked against the interval's defining quadratic over the predictions' counts."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfleet.runtime.metrics import read_jsonl
from tests.support.runs import EXAMPLE, ROOT, rlfleet_cmd, summary
from tests.support.wilson_reference import wilson_by_hand

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, EVAL_PROMPTS = 16, 48    # enough steps that the run is still going when the test scales and interrupts it


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _complete_checkpoints(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*") if (p / "meta.json").is_file()) \
        if root.is_dir() else []


def _wait(predicate, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_progress_scale_hint_interrupt_resume_predictions_and_intervals(warm_model: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = {"trainer.steps": STEPS, "trainer.groups_per_step": 2, "buffer.max_staleness": 0,
                 "rollout.claim_groups": 4, "trainer.checkpoint_every": 2, "eval.every_steps": 8,
                 "eval.max_prompts": EVAL_PROMPTS}
    cmd = rlfleet_cmd(EXAMPLE, run_dir, warm_model, overrides)
    err1 = tmp_path / "first.err"
    with err1.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            metrics = run_dir / "metrics" / "trainer.jsonl"
            _wait(lambda: any("loss" in r for r in read_jsonl(metrics)) if metrics.exists() else False, proc,
                  "the first step")
            # a synchronous run with 2 groups a step: replica 0 holds both (claim_groups 4), a second gets nothing
            scaled = subprocess.run([sys.executable, "-m", "rlfleet.cli", "scale", str(run_dir), "rollout=2"],
                                    cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
            assert scaled.returncode == 0, scaled.stderr
            assert "note: 1 of 2 rollout replicas will get no work" in scaled.stdout, scaled.stdout
            assert "at most 2 groups at once" in scaled.stdout and "rollout.claim_groups: 1" in scaled.stdout
            _wait(lambda: any(s >= 3 for s in _complete_checkpoints(run_dir)), proc, "a checkpoint after step 3")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=120) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
    first = err1.read_text()
    # the evaluation before training reported itself (count, time, rate) before the first step's line; how many of
    # its in-between states the launcher's 0.5 s loop catches depends on the machine's speed (none when it takes
    # 0.3 s): the reporter's lines are tests/unit/runtime/test_progress.py's
    before = first.index(f"evaluation before training: {EVAL_PROMPTS}/{EVAL_PROMPTS} prompts in")
    first_step = re.search(rf"^step \d+ \(\d+/{STEPS} done\)", first, re.M)   # the launcher's poll may not catch step 0
    assert first_step is not None and before < first_step.start(), first[:3000]
    assert "prompts/s" in first[before:].splitlines()[0]
    assert "1 of 2 rollout replicas will get no work" in first           # the run's console says it too
    # Ctrl-C: what was saved and the command that resumes
    last = _complete_checkpoints(run_dir)[-1]
    assert f"Saved in {run_dir}: checkpoint step_{last:08d} (step {last}: {last + 1} of {STEPS} steps trained)" \
        in first, first[-2000:]
    resume = first.split("resume with: ", 1)[1].splitlines()[0]
    argv = shlex.split(resume)
    assert argv[:3] == ["rlfleet", "run", str(EXAMPLE)] and argv[-1] == "--resume"
    second = subprocess.run([sys.executable, "-m", "rlfleet.cli", *argv[1:]], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (f"resuming {run_dir} from checkpoint step_{last:08d}: steps 0-{last} trained, continuing at step "
            f"{last + 1}") in second.stderr

    s = summary(run_dir)
    assert s["steps"] == STEPS
    heldout = [json.loads(line) for line in (run_dir / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) == EVAL_PROMPTS and all("prompt" in r and "label" in r for r in heldout)
    files = sorted((run_dir / "predictions").glob("step_*.jsonl"))
    assert {f.name for f in files} >= {"step_0.jsonl", f"step_{STEPS}.jsonl"}
    passed = {}
    for f in files:
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        assert [r["index"] for r in rows] == [r["index"] for r in heldout]
        for r in rows:             # the example's reward (exact match), recomputed from the written completion
            assert r["reward"] == (1.0 if r["completion"].strip() == r["label"] else 0.0), r
            assert r["prompt"] == heldout[r["index"]]["prompt"]
        passed[f.name] = sum(1 for r in rows if r["reward"] >= 1.0)
    k0, k1 = passed["step_0.jsonl"], passed[f"step_{STEPS}.jsonl"]
    assert s["eval_before"] == pytest.approx(k0 / EVAL_PROMPTS) and s["eval_after"] == pytest.approx(k1 / EVAL_PROMPTS)
    assert s["eval_before_ci95"] == pytest.approx(wilson_by_hand(k0, EVAL_PROMPTS), abs=1e-9)
    assert s["eval_after_ci95"] == pytest.approx(wilson_by_hand(k1, EVAL_PROMPTS), abs=1e-9)
    lo, hi = wilson_by_hand(k0, EVAL_PROMPTS)
    assert s["eval_change_outside_ci95"] == (not lo <= k1 / EVAL_PROMPTS <= hi)
    assert f"95% intervals (Wilson, {EVAL_PROMPTS} prompts)" in second.stderr
    assert (run_dir / "reward_curve.png").stat().st_size > 0


def test_warm_start_shows_its_progress(tmp_path: Path) -> None:
    code = ("import sys, torch; from transformers import AutoTokenizer\n"
            "from examples.addition.model import build_random_model\n"
            "from examples.addition.warm_start import supervised\n"
            "torch.set_num_threads(1); from pathlib import Path; m = build_random_model(Path(sys.argv[1]), seed=0)\n"
            "supervised(m, AutoTokenizer.from_pretrained(sys.argv[1]), 30, 0, batch=8)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("warm start: supervised steps")]
    assert lines[0] == "warm start: supervised steps (at most 30): 0/30 steps (0%), 0.0 steps/s, ETA ?"
    assert lines[-1].startswith("warm start: supervised steps (at most 30): 30/30 steps in ") and "steps/s" in lines[-1]
