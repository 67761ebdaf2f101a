"""Helpers for end-to-end tests: a cached warm-start model and `rlfleet run` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "addition" / "config.yaml"


def rlfleet_cmd(config: Path, run_dir: Path, model_dir: Path, overrides: dict[str, Any]) -> list[str]:
    sets = {"run.dir": str(run_dir), "model.path": str(model_dir), **overrides}
    cmd = [sys.executable, "-m", "rlfleet.cli", "run", str(config)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return cmd


def run_rlfleet(run_dir: Path, model_dir: Path, overrides: dict[str, Any], config: Path = EXAMPLE,
                timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(rlfleet_cmd(config, run_dir, model_dir, overrides), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def failure_report(result: subprocess.CompletedProcess[str], run_dir: Path, lines: int = 25) -> str:
    """What a failed `rlfleet run` said, plus the end of every service log: enough to diagnose it from CI output."""
    parts = [f"exit {result.returncode}; stderr:\n{result.stderr[-3000:]}"]
    for log in sorted((run_dir / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name} ---\n" + "\n".join(tail))
    return "\n".join(parts)
