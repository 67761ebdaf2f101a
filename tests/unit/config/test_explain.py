"""`rlfleet check --explain FIELD` prints a config field's dotted name, type, default and description from the
models, and refuses an unknown name with a "did you mean"; run through the CLI in its own process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", "check", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_explain_prints_name_type_default_and_description() -> None:
    done = _explain("--explain", "trainer.tis.level")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "trainer.tis.level"
    assert lines[1] == '  type: "token" | "sequence" | "geometric"'
    assert lines[2] == '  default: "token"'
    assert lines[3].startswith("  The ratio the weight is taken of: per token, the sequence's product")


def test_explain_gives_bounds_required_fields_and_sections() -> None:
    done = _explain("--explain", "trainer.groups_per_step")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:3] == ["  type: int (>= 1)", "  default: 8"]
    done = _explain("--explain", "model.path")
    assert done.stdout.splitlines()[1:3] == ["  type: str", "  default: required"]
    done = _explain("--explain", "trainer.tis")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "  type: section"
    assert done.stdout.splitlines()[-1] == "  fields: mode, clip, low, level"


def test_an_unknown_field_is_refused_with_did_you_mean() -> None:
    done = _explain("--explain", "trainer.tis.levle")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "unknown config field 'trainer.tis.levle'; did you mean trainer.tis.level" in done.stderr
    done = _explain("--explain", "trainer.dapo_clip_high")
    assert done.returncode == 2
    assert "moved to 'trainer.dapo.clip_high'" in done.stderr


def test_check_without_config_or_explain_is_a_usage_error() -> None:
    done = _explain()
    assert done.returncode == 2
    assert "give CONFIG (or --explain FIELD)" in done.stderr
