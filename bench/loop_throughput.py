"""Samples trained per second on the addition example: synchronous (max_staleness 0) vs asynchronous (2).

Both runs happen in this process's lifetime on the same machine, so the ratio is what to read.
Usage: python bench/loop_throughput.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.runtime.metrics import read_jsonl  # noqa: E402
from tests.support.runs import run_rlfleet  # noqa: E402


def steady_rate(run_dir: Path) -> float:
    """Samples/s between the end of the first step and the end of the last one (start-up excluded)."""
    steps = [r for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "loss" in r]
    if len(steps) < 2:
        return 0.0
    samples = sum(r["samples"] for r in steps[1:])
    return samples / (steps[-1]["time"] - steps[0]["time"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    ns = parser.parse_args()
    import torch

    from examples.addition.warm_start import prepare_in_process as prepare

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "warm_start"
        prepare(str(model), seed=0)
        rates = {}
        for staleness in (0, 2):
            run_dir = Path(tmp) / f"s{staleness}"
            result = run_rlfleet(run_dir, model, {"trainer.steps": ns.steps, "buffer.max_staleness": staleness,
                                                  "eval.every_steps": 0})
            if result.returncode != 0:
                raise SystemExit(result.stderr[-2000:])
            summary = json.loads((run_dir / "summary.json").read_text())
            rates[staleness] = steady_rate(run_dir)
            print(f"max_staleness={staleness}: {rates[staleness]:.1f} samples/s steady "
                  f"({summary['samples_per_s']:.1f} incl. start-up), held-out {summary.get('eval_before')} -> "
                  f"{summary.get('eval_after')}")
        print(f"async/sync samples-per-second ratio: {rates[2] / rates[0]:.2f}")


if __name__ == "__main__":
    main()
