"""`rlfleet run` with each weight transport: replicas end on the trainer's last version, verified by digest."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.requires import missing
from tests.support.runs import failure_report, run_rlfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("transport", ["broadcast", "disk_delta", "nixl"])
def test_run_with_transport(tmp_path: Path, warm_model: Path, transport: str) -> None:
    if transport == "nixl" and importlib.util.find_spec("nixl") is None:
        missing("nixl is not installed: pip install nixl==1.5.1")
    run_dir = tmp_path / "run"
    result = run_rlfleet(run_dir, warm_model, {"trainer.steps": 3, "trainer.groups_per_step": 8,
                                               "eval.max_prompts": 16, "weight_sync.transport": transport})
    assert result.returncode == 0, failure_report(result, run_dir)
    done = json.loads((run_dir / "trainer_done.json").read_text())
    assert done["version"] == 3 and done["replicas_current"] is True
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert f"published version 3 over {transport}" in trainer_log
    assert "serving weight version 3" in (run_dir / "logs" / "rollout-0.log").read_text()
