"""The README's run command, timed whole, at several git revisions in one invocation: what each change bought.

For each revision (oldest first) a git worktree is checked out and `rlfleet run examples/addition/config.yaml`
runs there from an empty run folder, exactly as `bash scripts/dev.sh run` does on a fresh clone (the warm start is
built inside the timed command), with this checkout's .venv (`python -m rlfleet.cli`, so each worktree imports its
own rlfleet). Prints wall seconds, samples/s, warm-start steps and held-out greedy accuracy before -> after per
revision, its phases (warm start and preflight, start to the first step, the steps, the last step to exit: from
the warm start's marker file and the trainer's step records), and each revision's wall-time ratio against the
previous and the first. Prints, never asserts: the
machine is shared, so read ratios from one invocation, and `--repeat` runs the revisions round-robin.

`--cached-warm-start` times the command as it runs the second time, and as issue 15 measured it ("from the same warm
start"): each revision builds its warm start once, untimed, and every timed run starts from a run folder that holds
only that cached `warm_start` folder. f686c82 (the last commit before the speed work) is the revision the issue's
118-126 s were measured on.

Usage: python bench/readme_run.py REV [REV ...] [--repeat N] [--cached-warm-start] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.runtime.metrics import read_jsonl  # noqa: E402


def worktree(rev: str, parent: Path) -> Path:
    path = parent / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev], check=True,
                   capture_output=True)
    return path


def clear_run_folder(tree: Path, keep_warm_start: bool) -> None:
    """Empty the run folder; with keep_warm_start the cached warm start (if built) stays, as on a second run."""
    run_dir = tree / "runs" / "addition"
    if not keep_warm_start or not (run_dir / "warm_start" / "warm_start.json").exists():
        shutil.rmtree(tree / "runs", ignore_errors=True)
        return
    for child in run_dir.iterdir():
        if child.name != "warm_start":
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def run_once(tree: Path, sets: list[str], keep_warm_start: bool = False) -> dict:
    """One README run in `tree` from an empty run folder (or one holding only the cached warm start): wall seconds
    and the run's summary."""
    clear_run_folder(tree, keep_warm_start)
    cmd = [sys.executable, "-m", "rlfleet.cli", "run", "examples/addition/config.yaml"]
    for s in sets:
        cmd += ["--set", s]
    start, t0 = time.monotonic(), time.time()
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
    wall, t_end = time.monotonic() - start, time.time()
    if out.returncode != 0:
        raise SystemExit(f"{tree}: rlfleet run exited {out.returncode}:\n{out.stderr[-3000:]}")
    run_dir = tree / "runs" / "addition"
    summary = json.loads((run_dir / "summary.json").read_text())
    marker_path = run_dir / "warm_start" / "warm_start.json"
    marker = json.loads(marker_path.read_text())
    steps = [r for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "loss" in r]
    # phases from wall-clock stamps: the warm start's marker file, the trainer's first and last step records
    ready = max(t0, marker_path.stat().st_mtime)          # a cached warm start was ready when the command began
    phases = {"warm": ready - t0, "start": steps[0]["time"] - ready,
              "steps": steps[-1]["time"] - steps[0]["time"], "end": t_end - steps[-1]["time"]}
    return {"wall": wall, "samples": summary["samples_trained"], "samples_per_s": summary["samples_trained"] / wall,
            "warm_steps": marker.get("steps"), "phases": phases,
            "before": summary.get("eval_before"), "after": summary.get("eval_after")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revs", nargs="+", help="git revisions, oldest first")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; each runs every revision once, in order")
    ap.add_argument("--set", action="append", default=[], help="passed to rlfleet run --set")
    ap.add_argument("--cached-warm-start", action="store_true",
                    help="build each revision's warm start once, untimed; time runs that start from it")
    a = ap.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="readme-run-"))
    trees = {rev: worktree(rev, parent) for rev in a.revs}
    results: dict[str, list[dict]] = {rev: [] for rev in a.revs}
    try:
        if a.cached_warm_start:
            for rev, tree in trees.items():
                res = run_once(tree, a.set)
                print(f"untimed first run {rev} (builds the warm start): {res['wall']:.1f} s", flush=True)
        for r in range(a.repeat):
            for rev, tree in trees.items():
                res = run_once(tree, a.set, keep_warm_start=a.cached_warm_start)
                results[rev].append(res)
                phases = ", ".join(f"{k} {v:.1f}" for k, v in res["phases"].items())
                print(f"round {r + 1} {rev}: {res['wall']:.1f} s ({phases}), {res['samples_per_s']:.0f} samples/s, "
                      f"warm start {res['warm_steps']} steps, held-out {res['before']} -> {res['after']}", flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
    print("\n| revision | wall (median) | warm start + checks | start to first step | steps | last step to exit | "
          "samples/s | warm-start steps | held-out before -> after | vs previous | vs first |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    first = prev = None
    for rev in a.revs:
        wall = statistics.median(x["wall"] for x in results[rev])
        last = results[rev][-1]
        first = first or wall
        phase = " | ".join(f"{statistics.median(x['phases'][k] for x in results[rev]):.1f} s"
                           for k in ("warm", "start", "steps", "end"))
        print(f"| {rev} | {wall:.1f} s | {phase} | {last['samples'] / wall:.0f} | {last['warm_steps']} | "
              f"{last['before']} -> {last['after']} | {(prev or wall) / wall:.2f}x | {first / wall:.2f}x |")
        prev = wall


if __name__ == "__main__":
    main()
