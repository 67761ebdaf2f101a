"""`rlfleet scale RUN_DIR rollout=N` on a live local run: one replica scaled to three and back to one mid-run.
New replicas register and claim by themselves; removed ones drain (finish or hand back their groups) and leave.
Every sample is accounted for: put = trained + dropped with a reason + still stored.

Generation is made latency-bound (each sample waits 150 ms, as a slow engine or tool call would), so that the
throughput at one and at three replicas says what scaling buys when rollout is the bottleneck; on this 2-core machine
compute-bound generation would gain little from more replicas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext
from rlfleet.runtime.metrics import read_jsonl
from rlfleet.sample import Sample
from rlfleet.services.rollout.rollout_fns import single_turn
from tests.support.runs import EXAMPLE, ROOT, rlfleet_cmd, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MARK_DIR = "RLFLEET_TEST_MARK_DIR"
STEPS, GROUPS, GROUP_SIZE, LEASE = 22, 8, 4, 600.0
UP_AT, AT_THREE = 4, 5           # scale to 3 at step UP_AT; back to 1 after AT_THREE steps with all 3 serving


def slow_rollout(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
    """single_turn with 150 ms of latency per sample; marks the first sample each replica delivers."""
    mark_dir = Path(os.environ[MARK_DIR])
    for sample in single_turn(ctx, prompt, ticket):
        time.sleep(0.15)
        mark = mark_dir / ctx.replica_id
        if not mark.exists():
            mark.write_text(str(time.time()))
        yield sample


def _scale(run_dir: Path, n: int) -> tuple[float, str]:
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "rlfleet.cli", "scale", str(run_dir), f"rollout={n}"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return start, out.stdout


def _trained(run_dir: Path) -> int:
    """The last trainer step whose record is written (-1 before the first)."""
    return max((r["step"] for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "step_seconds" in r),
               default=-1)


def _wait_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while _trained(run_dir) < step:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"step {step} not reached"
        time.sleep(0.1)


def _samples_per_s(records: list[dict], first: int, last: int) -> float:
    rows = [r for r in records if "step_seconds" in r and first <= r["step"] <= last]
    return sum(r["samples"] for r in rows) / (rows[-1]["time"] - rows[0]["time"] + 1e-9) if len(rows) > 1 else 0.0


def test_scale_one_to_three_and_back_mid_run(tmp_path: Path, warm_model: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK_DIR: str(marks)}
    overrides = {"trainer.steps": STEPS, "trainer.groups_per_step": GROUPS, "rollout.group_size": GROUP_SIZE,
                 "rollout.replicas": 1, "rollout.claim_groups": 2, "buffer.lease_seconds": LEASE,
                 "rollout.drain_seconds": 10, "eval.every_steps": 0, "eval.max_prompts": 16,
                 "trainer.checkpoint_every": 100, "rollout.rollout_fn": "tests.e2e.test_scale_rollout:slow_rollout"}
    started = time.monotonic()
    proc = subprocess.Popen(rlfleet_cmd(EXAMPLE, run_dir, warm_model, overrides), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_step(run_dir, UP_AT, proc)
        up_at, out = _scale(run_dir, 3)
        assert "rollout replicas: 3 (rollout-0, rollout-1, rollout-2)" in out
        deadline = time.monotonic() + 120
        while not ((marks / "rollout-1").exists() and (marks / "rollout-2").exists()):
            assert time.monotonic() < deadline, "the new replicas delivered no sample"
            time.sleep(0.1)
        first_sample = max(float((marks / f"rollout-{i}").read_text()) for i in (1, 2)) - up_at
        three_from = _trained(run_dir) + 1                    # the first step all three replicas work on
        assert three_from + AT_THREE < STEPS - 2, "the new replicas took too long to start for this run's length"
        _wait_step(run_dir, three_from + AT_THREE, proc)
        _, out = _scale(run_dir, 1)
        assert "rollout replicas: 1 (rollout-0)" in out
        refused = subprocess.run([sys.executable, "-m", "rlfleet.cli", "scale", str(run_dir), "rollout=0"],
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 2 and "between 1 and 64" in refused.stderr
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err[-3000:]
    assert elapsed < LEASE, "groups of the leaving replicas waited for lease expiry"
    procs = json.loads((run_dir / "processes.json").read_text())
    assert sorted(n for n in procs if n.startswith("rollout")) == ["rollout-0"]

    s = summary(run_dir)
    b = s["buffer"]
    assert s["steps"] == STEPS and not s["replica_restarts"]
    assert b["acked_samples"] == STEPS * GROUPS * GROUP_SIZE, "every step trained on whole groups"
    assert "failed" not in b["dropped"]
    assert b["put_samples"] == b["acked_samples"] + sum(b["dropped"].values()) + b["stored_samples"], b
    records = read_jsonl(run_dir / "metrics" / "trainer.jsonl")
    one, three = _samples_per_s(records, 1, UP_AT), _samples_per_s(records, three_from + 1, three_from + AT_THREE)
    print(f"\nscale: first sample from the new replicas {first_sample:.1f}s after `rlfleet scale`; "
          f"samples/s at 1 replica {one:.1f}, at 3 replicas {three:.1f} (x{three / max(one, 1e-9):.2f}); "
          f"buffer {b}; {elapsed:.0f}s")
