"""python -m tests.cluster.play [--values FILE] [--ops scale,kill-buffer,...] [--set KEY=VALUE] [--work DIR]

Render the chart with the values file, play it on podman, run the operations, print held-out before/after, each
event's recovery and the ledger, tear it down. Exit 0 when the ledger is clean (lost 0, trained twice 0, nothing
unexpected) and every event recovered. scripts/chart_play.sh builds the images first and calls this.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from tests.cluster.chart import VALUES
from tests.cluster.play.scenario import DEFAULT_OPS, OPS, play


def set_value(values: dict, key: str, raw: str) -> None:
    """helm's --set KEY=VALUE (dotted key; the value parsed as YAML)."""
    *parents, last = key.split(".")
    node = values
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = yaml.safe_load(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.play", description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=Path, default=VALUES / "play-cpu.yaml")
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma-separated, in order (of "
                        f"{', '.join(OPS)}; '' for none; scale needs cert-manager mode, docs/cluster.md)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--work", type=Path, default=None, help="keep files and container logs here")
    parser.add_argument("--keep-volumes", action="store_true")
    ns = parser.parse_args(argv)
    values = yaml.safe_load(ns.values.read_text())
    for item in ns.set:
        key, _, raw = item.partition("=")
        set_value(values, key, raw)
    work = ns.work or Path(tempfile.mkdtemp(prefix="rlfleet-play-"))
    work.mkdir(parents=True, exist_ok=True)
    ops = [o for o in ns.ops.split(",") if o]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # a stop tears the release down too (finally)
    outcome = play(values, work, ops, log=lambda line: print(line, flush=True), keep=ns.keep_volumes)
    print(f"played run: wall {outcome.wall_s:.0f} s; files and logs in {work}")
    return 0 if outcome.verdict.ok and not outcome.verdict.unexpected else 1


if __name__ == "__main__":
    sys.exit(main())
