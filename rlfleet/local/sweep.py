"""`rlfleet sweep CONFIG --set trainer.lr=1e-6,1e-5 --set trainer.steps=30`: every combination of the values given
(comma-separated; a YAML list or mapping is one value) run one after another, each as its own `rlfleet run` in
RUN_DIR/sweep/<NN>_<variant>/, then one table: held-out greedy accuracy before and after with Wilson 95%
intervals, whether the after lies outside the before's interval, the train reward's first and last 10% of steps,
and wall time. The table is also written to RUN_DIR/sweep/sweep.json and sweep.txt.

Variants run one after another on this machine (each `rlfleet run` already spreads its services over the cores); a
variant that fails is reported in the table and the sweep goes on.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlfleet.config import ConfigError, load_config
from rlfleet.run_dir.atomic import write_text_atomic

SWEEP_DIR = "sweep"


@dataclass
class Variant:
    index: int
    sets: dict[str, str]                      # key -> the value as given on the command line
    run_dir: Path
    returncode: int | None = None
    wall_seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return " ".join(f"{k.rpartition('.')[2]}={v}" for k, v in self.sets.items()) or "as configured"


def split_values(text: str) -> list[str]:
    """'1e-6,1e-5' -> ['1e-6', '1e-5']; a YAML list or mapping ('[1, 2]', '{a: 1}') is one value."""
    stripped = text.strip()
    if stripped[:1] in "[{" or "," not in stripped:
        return [stripped]
    return [v.strip() for v in stripped.split(",") if v.strip()]


def variants(pairs: list[str], base_dir: Path) -> list[Variant]:
    """The grid of --set KEY=V1,V2,... pairs, each combination with its own run folder under base_dir/sweep/."""
    keys: list[str] = []
    options: list[list[str]] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair}: expected key=value[,value...]")
        keys.append(key)
        options.append(split_values(value))
    out = []
    for i, combo in enumerate(itertools.product(*options) if options else [()]):
        sets = dict(zip(keys, combo, strict=True))
        slug = re.sub(r"[^A-Za-z0-9.=_-]+", "_", "_".join(f"{k.rpartition('.')[2]}={v}" for k, v in sets.items()))
        out.append(Variant(i, sets, base_dir / SWEEP_DIR / f"{i:02d}_{slug or 'base'}"[:120]))
    return out


def run_variant(config: Path, variant: Variant) -> None:
    """One `rlfleet run` of the variant in its own folder (fresh), its console passed through with a prefix."""
    cmd = [sys.executable, "-m", "rlfleet.cli", "run", str(config), "--fresh"]
    for key, value in {**variant.sets, "run.dir": str(variant.run_dir)}.items():
        cmd += ["--set", f"{key}={value}"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ})
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(f"[{variant.index:02d}] {line}")
    variant.returncode = proc.wait()
    variant.wall_seconds = time.monotonic() - started
    try:
        variant.summary = json.loads((variant.run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        variant.summary = {}


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _ci(c: list[float] | None) -> str:
    return "-" if not c else f"[{c[0]:.3f}, {c[1]:.3f}]"


def table_rows(done: list[Variant]) -> list[dict[str, Any]]:
    rows = []
    for v in done:
        s = v.summary
        reward = (s.get("windows") or {}).get("reward_mean") or {}
        rows.append({"variant": v.name, "run_dir": str(v.run_dir), "exit": v.returncode,
                     "before": s.get("eval_before"), "after": s.get("eval_after"),
                     "before_ci95": s.get("eval_before_ci95"), "after_ci95": s.get("eval_after_ci95"),
                     "outside_ci95": s.get("eval_change_outside_ci95"), "prompts": s.get("eval_prompts"),
                     "train_reward_first": reward.get("first"), "train_reward_last": reward.get("last"),
                     "wall_seconds": round(v.wall_seconds, 1)})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ["variant", "held-out before", "95% CI", "after", "95% CI", "change", "train reward", "wall"]
    lines = []
    for r in rows:
        change = (f"failed (exit {r['exit']})" if r["exit"] not in (0, None) else
                  "-" if r["outside_ci95"] is None else
                  "outside before's CI" if r["outside_ci95"] else "within noise")
        lines.append([r["variant"], _fmt(r["before"]), _ci(r["before_ci95"]), _fmt(r["after"]), _ci(r["after_ci95"]),
                      change, f"{_fmt(r['train_reward_first'])} -> {_fmt(r['train_reward_last'])}",
                      f"{r['wall_seconds']:.0f}s"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=True)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in lines]
    n = next((r["prompts"] for r in rows if r["prompts"]), None)
    if n:
        out.append(f"(held-out greedy accuracy over {n} prompts; 95% CI: Wilson; change: whether the after lies "
                   "outside the before's interval)")
    return "\n".join(out)


def sweep(config: Path, pairs: list[str]) -> list[dict[str, Any]]:
    """Run every variant, print the table, write it to RUN_DIR/sweep/. ConfigError for a bad --set or config."""
    first = variants(pairs, Path("."))[0]            # run.dir given once applies to every variant: the base
    base = load_config(config, {k: yaml.safe_load(val) for k, val in first.sets.items()}).run_dir
    grid = variants(pairs, base)
    for v in grid:                                   # every variant's config must load before any runs
        load_config(config, {k: yaml.safe_load(val) for k, val in v.sets.items()})
    done: list[Variant] = []
    for v in grid:
        print(f"rlfleet sweep: variant {v.index + 1}/{len(grid)}: {v.name} -> {v.run_dir}", file=sys.stderr)
        run_variant(config, v)
        done.append(v)
    rows = table_rows(done)
    text = format_table(rows)
    write_text_atomic(base / SWEEP_DIR / "sweep.json", json.dumps(rows, indent=2))
    write_text_atomic(base / SWEEP_DIR / "sweep.txt", text + "\n")
    print(text)
    return rows
