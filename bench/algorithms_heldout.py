"""Held-out accuracy of the issue-13 algorithms on the addition example (30 steps, 500 held-out prompts), each run
against a same-run GRPO baseline, and the true on-policy run's per-step logprob_abs_diff and its cost.

    python bench/algorithms_heldout.py [--steps 30] [--only NAME ...] [--out results.json]

Each variant is a real `rlfleet run` of examples/addition/config.yaml from the same warm-start model (built once,
cached in --model-dir). Prints eval pass rate before / after and the change; for on_policy, the largest
logprob_abs_diff over the steps, how many steps had exactly 0.0, the run's wall time and generated tokens per wall
second, each as a ratio to the baseline run.

Measured 2026-12-01 on the shared 2-core machine (load 2-19, so wall times are only indicative); eval pass rate on
500 held-out prompts, before 0.166 for every run (same warm start):
  grpo (no dual-clip) 0.244 (+0.078) | rloo 0.214 (+0.048) | on_policy 0.244 (+0.078; logprob_abs_diff 0.0 on
  30/30 steps, wall x1.98 vs grpo) | minibatches 4: dual-clip 0.224 (+0.058), no dual-clip 0.212 (+0.046) |
  agg seq-mean-token-mean 0.234 (+0.068), seq-mean-token-sum-norm 0.236 (+0.070), token-sum 0.242 (+0.076),
  seq-mean-token-sum 0.242 (+0.076) | scale_rewards batch 0.230 (+0.064).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlfleet.runtime.metrics import read_jsonl  # noqa: E402
from tests.support.runs import failure_report, run_rlfleet, summary  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"trainer.algorithm": "grpo", "trainer.policy_loss.clip_ratio_c": 0.0},          # the baseline
    "rloo": {"trainer.algorithm": "rloo"},
    # dual-clip matters off-policy: 4 minibatches per step (3 of 4 updates on stale old log-probs)
    "grpo_minibatch4_no_dual_clip": {"trainer.minibatches": 4, "trainer.policy_loss.clip_ratio_c": 0.0},
    "grpo_minibatch4_dual_clip": {"trainer.minibatches": 4, "trainer.policy_loss.clip_ratio_c": 3.0},
    "agg_seq-mean-token-mean": {"trainer.policy_loss.agg": "seq-mean-token-mean"},
    "agg_seq-mean-token-sum": {"trainer.policy_loss.agg": "seq-mean-token-sum"},
    "agg_seq-mean-token-sum-norm": {"trainer.policy_loss.agg": "seq-mean-token-sum-norm",
                                    "trainer.drgrpo.max_tokens": 5},
    "agg_token-sum": {"trainer.policy_loss.agg": "token-sum"},
    "grpo_scale_batch": {"trainer.estimator.scale_rewards": "batch"},
    "on_policy": {"trainer.on_policy": True},
}


def _warm_model(model_dir: Path) -> Path:
    from examples.addition.warm_start import prepare_in_process as prepare

    if not (model_dir / "config.json").exists():
        prepare(str(model_dir), seed=0)
    return model_dir


def _run(name: str, overrides: dict[str, Any], model: Path, work: Path, steps: int) -> dict[str, Any]:
    run_dir = work / name
    base = {"trainer.steps": steps, "eval.every_steps": 0, "trainer.checkpoint_every": steps, "eval.max_prompts": 500}
    start = time.perf_counter()
    result = run_rlfleet(run_dir, model, {**base, **overrides}, timeout=3600)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        return {"name": name, "error": failure_report(result, run_dir)[-2000:]}
    s = summary(run_dir)
    rows = [r for r in read_jsonl(run_dir / "metrics" / "trainer.jsonl") if "loss" in r]
    rollout = [r for p in sorted((run_dir / "metrics").glob("rollout-*.jsonl")) for r in read_jsonl(p)]
    tokens = max((r.get("generated_tokens", 0) for r in rollout), default=0)
    diffs = [r.get("logprob_abs_diff") for r in rows]
    return {"name": name, "eval_before": s["eval_before"], "eval_after": s["eval_after"], "wall_s": wall,
            "generated_tokens": tokens, "tokens_per_wall_s": tokens / wall, "steps": len(rows),
            "logprob_abs_diff_max": max((d for d in diffs if d is not None), default=None),
            "steps_with_zero_diff": sum(1 for d in diffs if d == 0.0),
            "entropy_first_last": [rows[0].get("entropy"), rows[-1].get("entropy")] if rows else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/rlfleet-bench/warm_start"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/rlfleet-bench/runs"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = _warm_model(args.model_dir)
    names = ["grpo", *[n for n in (args.only or VARIANTS) if n != "grpo"]]
    results = []
    for name in names:
        r = _run(name, VARIANTS[name], model, args.work, args.steps)
        results.append(r)
        print(json.dumps(r), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    base = results[0]
    print(f"\n{'variant':32s} {'before':>7s} {'after':>7s} {'change':>7s}  notes")
    for r in results:
        if "error" in r:
            print(f"{r['name']:32s} FAILED: {r['error'][-300:]}")
            continue
        note = ""
        if r["name"] == "on_policy":
            note = (f"logprob_abs_diff max {r['logprob_abs_diff_max']}, exactly 0.0 on {r['steps_with_zero_diff']}/"
                    f"{r['steps']} steps; wall x{r['wall_s'] / base['wall_s']:.2f}, generated tokens per wall second "
                    f"x{r['tokens_per_wall_s'] / base['tokens_per_wall_s']:.3f} vs grpo")
        print(f"{r['name']:32s} {r['eval_before']:7.3f} {r['eval_after']:7.3f} "
              f"{r['eval_after'] - r['eval_before']:+7.3f}  {note}")


if __name__ == "__main__":
    main()
