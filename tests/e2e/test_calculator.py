"""The calculator agent example runs to completion: an agent on the `openai` client, multi-turn TITO samples with tool
tokens masked out, the run's OpenAI gateway in front of the replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.calculator_model import calculator_model_dir
from tests.support.runs import ROOT, failure_report, run_rlfleet, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
CONFIG = ROOT / "examples" / "calculator" / "config.yaml"


@pytest.fixture(scope="module")
def calculator_model() -> Path:
    return calculator_model_dir()


def test_calculator_example_runs(tmp_path: Path, calculator_model: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, calculator_model, {"trainer.steps": 4, "rollout.group_size": 4},
                         config=CONFIG, timeout=1200)
    assert result.returncode == 0, failure_report(result, run_dir)
    s = summary(run_dir)
    assert s["steps"] == 4
    warnings = [line for line in (run_dir / "logs" / "rollout-0.log").read_text().splitlines() if "WARNING" in line]
    assert s["buffer"]["acked_samples"] == 4 * 8 * 4, (s["buffer"], warnings[-10:])
    assert not {"failed", "aborted"} & set(s["buffer"]["dropped"]), (s["buffer"], warnings[-10:])
    log = (run_dir / "metrics" / "trainer.jsonl").read_text()
    assert '"reward_mean"' in log
    assert (run_dir / "pki" / "openai-api.key").stat().st_mode & 0o777 == 0o600     # mtls: the endpoint's key
    assert "OpenAI gateway for the run's replicas at http://127.0.0.1:" in \
        (run_dir / "logs" / "openai-gateway.log").read_text()
    assert "serves the OpenAI API at http://127.0.0.1:" in (run_dir / "logs" / "rollout-0.log").read_text()
