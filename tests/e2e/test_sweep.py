"""`rlfleet sweep` (issue 43 item 7): two learning rates of the addition example run one after another, and one table
gives each variant's held-out accuracy before and after with its Wilson 95% interval and wall time, read back
against each variant's own summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import EXAMPLE, ROOT
from tests.support.wilson_reference import wilson_by_hand

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = 32


def test_sweep_runs_each_variant_and_prints_one_table(warm_model: Path, tmp_path: Path) -> None:
    base = tmp_path / "sweep_base"
    cmd = [sys.executable, "-m", "rlfleet.cli", "sweep", str(EXAMPLE), "--set", "trainer.lr=1e-4,3e-3",
           "--set", "trainer.steps=2", "--set", f"run.dir={base}", "--set", f"model.path={warm_model}",
           "--set", f"eval.max_prompts={PROMPTS}", "--set", "trainer.groups_per_step=4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((base / "sweep" / "sweep.json").read_text())
    assert len(rows) == 2
    assert [r["variant"].split()[0] for r in rows] == ["lr=1e-4", "lr=3e-3"]
    table = out.stdout.splitlines()
    assert table[0].split()[:3] == ["variant", "held-out", "before"] and len(table) == 4   # head, 2 rows, note
    for row, line in zip(rows, table[1:3], strict=True):
        s = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert Path(row["run_dir"]).parent == base / "sweep" and s["steps"] == 2
        assert row["before"] == s["eval_before"] and row["after"] == s["eval_after"]
        for key, rate in (("before_ci95", s["eval_before"]), ("after_ci95", s["eval_after"])):
            assert row[key] == pytest.approx(wilson_by_hand(round(rate * PROMPTS), PROMPTS), abs=1e-9)
        assert line.startswith(row["variant"]) and f"{row['after']:.3f}" in line and row["wall_seconds"] > 0
    assert rows[0]["before"] == rows[1]["before"]             # the same start, greedy: the same accuracy
