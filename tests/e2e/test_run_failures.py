"""What a user sees when something goes wrong in `rlfleet run`: clear errors, nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import ROOT, failure_report, rlfleet_cmd, run_rlfleet, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_reward_that_raises_is_recorded_and_run_goes_on(tmp_path: Path, warm_model: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, warm_model, {"trainer.steps": 4, "eval.data_source": None,
                                               "rollout.reward_fn": "tests.support.flaky_reward:flaky_exact_match"})
    assert result.returncode == 0, failure_report(result, run_dir)
    s = summary(run_dir)
    assert s["steps"] == 4
    assert s["buffer"]["dropped"].get("failed", 0) >= 1
    log = (run_dir / "logs" / "rollout-0.log").read_text()
    assert "ValueError: cannot score prompt" in log


def test_config_and_plugin_errors_are_short(tmp_path: Path, warm_model: Path) -> None:
    r = run_rlfleet(tmp_path / "a", warm_model, {"trainer.stepz": 3})
    assert r.returncode == 2 and "trainer.stepz: unknown field" in r.stderr and "Traceback" not in r.stderr
    r = run_rlfleet(tmp_path / "b", warm_model, {"rollout.reward_fn": "my_rewards.missing:fn"})
    assert r.returncode == 2 and "module 'my_rewards.missing' could not be imported" in r.stderr
    assert "Traceback" not in r.stderr


# What a script's background job gets: SIGINT ignored, inherited across exec. Set in a small exec wrapper, not a
# preexec_fn: Python code between fork and exec in this gRPC-threaded pytest process can abort the child.
IGNORING_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                   "os.execv(sys.argv[1], sys.argv[1:])")


def _start(tmp_path: Path, warm_model: Path,
           ignore_sigint: bool = False) -> tuple[subprocess.Popen[str], Path]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = rlfleet_cmd(ROOT / "examples/addition/config.yaml", run_dir, warm_model,
                      {"trainer.steps": 500, "eval.data_source": None})
    if ignore_sigint:
        cmd = [sys.executable, "-c", IGNORING_SIGINT, *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    metrics = run_dir / "metrics" / "trainer.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and '"loss"' in metrics.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no training step within 300 s"
        time.sleep(0.5)
    return proc, run_dir


def test_dead_service_stops_the_run_with_its_reason(tmp_path: Path, warm_model: Path) -> None:
    # A dead rollout replica is restarted (tests/e2e/test_replica_failure.py); a dead trainer stops the run.
    proc, run_dir = _start(tmp_path, warm_model)
    pids = json.loads((run_dir / "processes.json").read_text())
    os.kill(pids["trainer-0"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "trainer-0 stopped (killed by SIGKILL)" in err
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_ctrl_c_leaves_no_orphans(tmp_path: Path, warm_model: Path) -> None:
    """Also when the run was started with SIGINT ignored (what a background job of a script inherits)."""
    proc, run_dir = _start(tmp_path, warm_model, ignore_sigint=True)
    pids = json.loads((run_dir / "processes.json").read_text())
    try:
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:                                  # a run that ignored the signal must not outlive the test
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in pids.values():
                if _alive(pid):
                    os.killpg(pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    time.sleep(0.5)
    assert not [name for name, pid in pids.items() if _alive(pid)]
