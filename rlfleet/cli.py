"""The `rlfleet` command: run a config on this machine, or check it."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rlfleet.config import ConfigError, explain, load_config
from rlfleet.plugins import PluginError


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair}: expected key=value")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet", description="RL post-training as four gRPC services.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run CONFIG with every service as a local process")
    p_run.add_argument("config")
    p_run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set trainer.steps=5")
    p_run.add_argument("--resume", action="store_true", help="continue the run in the run folder")
    p_run.add_argument("--fresh", action="store_true", help="delete the run folder's previous state first")
    p_check = sub.add_parser("check", help="validate CONFIG and import every plugin it names")
    p_check.add_argument("config", nargs="?")
    p_check.add_argument("--explain", metavar="FIELD", help="print a config field's type, default and description "
                         "(e.g. trainer.tis.level) instead of checking a config")
    p_check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p_chart = sub.add_parser("chart-check", help="check a stack of Helm values files against the GPUs, memory and "
                             "model they name (before helm install)")
    p_chart.add_argument("values", nargs="+", help="values files, in -f order")
    p_sweep = sub.add_parser("sweep", help="run CONFIG once per combination of --set values, then print one table")
    p_sweep.add_argument("config")
    p_sweep.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2,...",
                         help="values to sweep, comma-separated (one value: a plain override), e.g. "
                              "--set trainer.lr=1e-6,1e-5")
    p_scale = sub.add_parser("scale", help="change the rollout replica count of a live local run")
    p_scale.add_argument("run_dir", help="the run folder (run.dir) of a live `rlfleet run`")
    p_scale.add_argument("target", help="rollout=N")
    p_scale.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the run to settle")
    p_convert = sub.add_parser("convert", help="export a trainer checkpoint's policy as an HF safetensors folder")
    p_convert.add_argument("checkpoint", help="RUN_DIR/checkpoints/step_N")
    p_convert.add_argument("out_dir")
    p_convert.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p_buffer = sub.add_parser("buffer", help="check or repair the embedded buffer store of a run folder")
    p_buffer.add_argument("action", choices=["verify", "salvage"])
    p_buffer.add_argument("run_dir")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if ns.command == "scale":
        from rlfleet.local.scaling import ScaleError, scale, scale_hint

        try:
            status = scale(Path(ns.run_dir), ns.target, ns.timeout)
        except ScaleError as exc:
            print(f"rlfleet scale: {exc}", file=sys.stderr)
            return 2
        print(f"rollout replicas: {len(status.running)} ({', '.join(status.running)})")
        hint = scale_hint(Path(ns.run_dir), len(status.running))
        if hint:
            print(f"note: {hint}")
        return 0
    if ns.command == "chart-check":
        from rlfleet.chart.report import main as chart_check

        return chart_check([Path(v) for v in ns.values])
    if ns.command == "sweep":
        from rlfleet.local.sweep import sweep

        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            rows = sweep(Path(ns.config), ns.set)
        except ConfigError as exc:
            print(f"rlfleet sweep: {exc}", file=sys.stderr)
            return 2
        return 0 if all(r["exit"] == 0 for r in rows) else 1
    if ns.command == "check" and ns.explain is not None:
        try:
            print(explain(ns.explain))
        except ConfigError as exc:
            print(f"rlfleet: {exc}", file=sys.stderr)
            return 2
        return 0
    if ns.command == "check" and ns.config is None:
        p_check.error("give CONFIG (or --explain FIELD)")
    if ns.command == "buffer":        # the buffer's code reads its own log format, in its own process
        return subprocess.run([sys.executable, "-m", "rlfleet.services.buffer.stores.repair", ns.action, ns.run_dir],
                              check=False).returncode
    if ns.command == "convert":       # the trainer's code reads its own checkpoint format, in its own process
        cmd = [sys.executable, "-m", "rlfleet.services.trainer.export", ns.checkpoint, ns.out_dir]
        return subprocess.run(cmd + (["--dtype", ns.dtype] if ns.dtype else []), check=False).returncode

    # Plugins (config dotted paths such as examples.addition.reward:score) import from the current directory, as in
    # the services the launcher starts (it puts the same directory on their PYTHONPATH); examples/ is not installed.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from rlfleet.local.launcher import RunError, run
    from rlfleet.local.preflight import check_run

    cfg = None
    try:
        cfg = load_config(ns.config, _overrides(ns.set))
        if ns.command == "check":
            check_run(cfg)
            print(f"{ns.config}: ok")
            return 0
        run(cfg, Path(ns.config), fresh=ns.fresh, resume=ns.resume)
        return 0
    except (ConfigError, PluginError) as exc:
        print(f"rlfleet: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"\nrlfleet: run failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        from rlfleet.local.resume_notes import interrupted_note

        print("\n" + (interrupted_note(cfg.run_dir, ns.config, ns.set, cfg.trainer.steps) if cfg is not None
                      else "rlfleet: interrupted"), file=sys.stderr)
        return 130


def console_main() -> int:
    """The `rlfleet` command (and `python -m rlfleet.cli`): main, then a quick exit
    (rlfleet/runtime/process_exit.py)."""
    from rlfleet.runtime.process_exit import without_final_collection

    return without_final_collection(main())


if __name__ == "__main__":
    raise SystemExit(console_main())
