"""What a local run shows a person: a progress line, a reward-curve PNG and a final summary."""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from rlfleet.local.intervals import wilson
from rlfleet.run_dir.atomic import write_bytes_atomic
from rlfleet.runtime.metrics import read_jsonl
from rlfleet.runtime.progress import ProgressState, format_seconds, read_phase_files


class MetricsTail:
    """Reads new complete lines of a JSONL file as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def evals_to_come(done: int, steps: int, every: int) -> int:
    """Evaluations the trainer still runs once `done` steps are trained: one every `every` steps before the last,
    and the one after training (rlfleet/services/trainer/service.py)."""
    middle = sum(1 for m in range(done + 1, steps) if every and m % every == 0)
    return middle + (1 if done < steps else 0)


class Progress:
    """One line per update on a terminal (rewritten in place), periodic lines otherwise; the phases services report in
    RUN_DIR/progress/ (an evaluation) as their own lines. The ETA counts the steps left at this run's seconds per
    step and the evaluations still to come at the last evaluation's duration."""

    def __init__(self, total_steps: int, stream: TextIO = sys.stderr, every: float = 5.0,
                 run_dir: Path | None = None, eval_every: int = 0, has_eval: bool = False) -> None:
        self.total = total_steps
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._last_print = 0.0
        self.last: dict[str, Any] = {}
        self.eval: dict[str, Any] = {}
        self.run_dir, self.eval_every, self.has_eval = run_dir, eval_every, has_eval
        self._phases: dict[str, ProgressState] = {}
        self._phase_print: dict[str, float] = {}
        self.eval_seconds: float | None = None           # the last finished evaluation's duration
        self._first_step: tuple[int, float] | None = None   # (steps done, monotonic time) at the first step record

    def phases(self) -> None:
        """Print each phase state that changed since the last look (at most every `every` seconds per phase, and
        always its first and last line)."""
        if self.run_dir is None:
            return
        now = time.monotonic()
        for key, state in read_phase_files(self.run_dir).items():
            seen = self._phases.get(key)
            if seen == state:
                continue
            new_phase = seen is None or seen.started_at != state.started_at
            if seen is not None and seen.finished and not new_phase:
                continue
            if not (new_phase or state.finished or now - self._phase_print.get(key, 0.0) >= self.every):
                continue
            self._phases[key] = state
            self._phase_print[key] = now
            if key == "eval" and state.finished:
                self.eval_seconds = state.elapsed
            self._write(state.line(), keep=state.finished or not self.tty)

    def eta(self, done: int) -> float | None:
        """Seconds left: steps at this run's pace so far, plus the evaluations still to come."""
        if self._first_step is None or done <= self._first_step[0]:
            return None
        per_step = (time.monotonic() - self._first_step[1]) / (done - self._first_step[0])
        left = per_step * (self.total - done)
        if self.has_eval and self.eval_seconds is not None:
            left += self.eval_seconds * evals_to_come(done, self.total, self.eval_every)
        return left

    def update(self, records: list[dict[str, Any]], idle: Sequence[str] = ()) -> None:
        """A progress line from the trainer's new metric records; `idle` names the rollout replicas that generated
        nothing lately while another did (rlfleet/local/replica_activity.py)."""
        self.phases()
        for rec in records:
            if "eval/pass_rate" in rec:
                self.eval = rec
            elif "loss" in rec:
                self.last = rec
        if not records or not self.last:
            return
        now = time.monotonic()
        step = int(self.last.get("step", -1)) + 1
        if self._first_step is None:
            self._first_step = (step, now)
        if not self.tty and now - self._last_print < self.every and step < self.total:
            return
        self._last_print = now
        width = 24
        filled = int(width * step / max(self.total, 1))
        # "step N" is the step's number in metrics/*.jsonl, TensorBoard and checkpoints/step_N (counted from 0)
        line = (f"step {step - 1} ({step}/{self.total} done) [{'#' * filled}{'.' * (width - filled)}] "
                f"reward {self.last.get('reward_mean', float('nan')):.3f}  "
                f"{self.last.get('samples_per_s', 0.0):.1f} samples/s")
        if "truncation_rate" in self.last:
            line += f"  trunc {self.last['truncation_rate']:.2f}"
        if self.eval:                                    # the latest evaluation, with the step it was taken at
            line += f"  eval@{int(self.eval.get('step', 0))} pass {self.eval['eval/pass_rate']:.3f}"
        eta = self.eta(step)
        if eta is not None and step < self.total:
            line += f"  ETA {format_seconds(eta)}"
        if idle:
            line += f"  idle: {', '.join(idle)}"
        self._write(line, keep=False)

    def _write(self, line: str, keep: bool) -> None:
        """A line: rewritten in place on a terminal unless `keep` (then it stays, ended by a newline)."""
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if keep else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def smoothing_window(n: int) -> int:
    """Steps a smoothed train line averages: about a tenth of the run, at least 1, at most 25."""
    return max(1, min(25, n // 10))


def moving_average(values: list[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def reward_curve(metrics_path: Path, png_path: Path) -> Path | None:
    """Plot reward per step (and held-out pass rate) into png_path."""
    records = read_jsonl(metrics_path)
    steps = [r for r in surviving_steps(records)[0] if "reward_mean" in r]
    evals = [r for r in records if "eval/pass_rate" in r]
    if not steps:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global backend, safe off the main thread

    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.subplots()
    xs, rewards = [r["step"] + 1 for r in steps], [float(r["reward_mean"]) for r in steps]
    ax.plot(xs, rewards, alpha=0.35, label="train reward (batch mean)")
    window = smoothing_window(len(rewards))
    ax.plot(xs, moving_average(rewards, window), label=f"train reward (mean of last {window} steps)")
    truncated = [float(r["truncation_rate"]) for r in steps if "truncation_rate" in r]
    if len(truncated) == len(steps):
        ax.plot(xs, truncated, ":", color="grey", label="truncation rate (hit max_new_tokens)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval/pass_rate"] for r in evals], "o-", label="held-out pass rate")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    png_path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(png_path, png.getvalue())
    return png_path


WINDOW_KEYS = ("reward_mean", "truncation_rate", "equal_reward_groups", "response_length_mean")


def window_means(steps: list[dict[str, Any]], fraction: float = 0.1) -> dict[str, dict[str, float]]:
    """Means of WINDOW_KEYS over the first and the last `fraction` of steps (at least one step each)."""
    if not steps:
        return {}
    n = max(1, int(round(len(steps) * fraction)))
    out: dict[str, dict[str, float]] = {}
    for key in WINDOW_KEYS:
        first = [float(r[key]) for r in steps[:n] if key in r]
        last = [float(r[key]) for r in steps[-n:] if key in r]
        if first and last:
            out[key] = {"first": sum(first) / len(first), "last": sum(last) / len(last), "steps": n}
    return out


def surviving_steps(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Step records of the run's surviving lineage, by step: a step trained again after a resume (its first
    training was lost with the trainer) counts once, as its last record. Returns (records, how many were replaced)."""
    by_step: dict[int, dict[str, Any]] = {}
    rows = [r for r in records if "loss" in r]
    for r in rows:
        by_step[int(r["step"])] = r
    return [by_step[k] for k in sorted(by_step)], len(rows) - len(by_step)


def held_out_intervals(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Wilson 95% intervals of the first and last held-out pass rates (over eval/prompts each), and whether the last
    lies outside the first's interval (a change larger than the noise of that many prompts)."""
    n_before, n_after = int(before.get("eval/prompts", 0)), int(after.get("eval/prompts", 0))
    lo = wilson(round(before["eval/pass_rate"] * n_before), n_before)
    hi = wilson(round(after["eval/pass_rate"] * n_after), n_after)
    return {"eval_prompts": n_after, "eval_before_ci95": [lo.low, lo.high], "eval_after_ci95": [hi.low, hi.high],
            "eval_change_outside_ci95": not lo.contains(after["eval/pass_rate"])}


def summarize(metrics_path: Path, wall_seconds: float, buffer_stats: dict[str, Any] | None,
              now: float | None = None) -> dict[str, Any]:
    """wall_seconds: this invocation's (a resumed run's started at its resume); its samples/s counts the samples
    this invocation trained (step records written since it started, `now` - wall_seconds, by their time)."""
    records = read_jsonl(metrics_path)
    steps, retrained = surviving_steps(records)
    evals = [r for r in records if "eval/pass_rate" in r]
    samples = sum(int(r.get("samples", 0)) for r in steps)
    start = (time.time() if now is None else now) - wall_seconds
    here = sum(int(r.get("samples", 0)) for r in records if "loss" in r and float(r.get("time", start)) >= start)
    out: dict[str, Any] = {
        "steps": len(steps),
        "samples_trained": samples,
        "steps_retrained": retrained,           # trained again after a resume: the first training was lost
        "wall_seconds": round(wall_seconds, 1),
        "samples_per_s": round(here / wall_seconds, 2) if wall_seconds > 0 else 0.0,
        "reward_first": steps[0]["reward_mean"] if steps else None,
        "reward_last": steps[-1]["reward_mean"] if steps else None,
        "windows": window_means(steps),          # first vs last 10% of steps
    }
    if evals:
        out["eval_before"] = evals[0]["eval/pass_rate"]
        out["eval_after"] = evals[-1]["eval/pass_rate"]
        out.update(held_out_intervals(evals[0], evals[-1]))
    if buffer_stats is not None:
        out["buffer"] = buffer_stats
    return out


def format_summary(summary: dict[str, Any], run_dir: Path) -> str:
    again = summary.get("steps_retrained") or 0
    lines = [f"run finished: {summary['steps']} steps, {summary['samples_trained']} samples"
             + (f" ({again} steps trained again after a resume)" if again else "")
             + f"; this run {summary['wall_seconds']:.0f}s ({summary['samples_per_s']:.1f} samples/s)"]
    windows = summary.get("windows") or {}
    labels = {"reward_mean": "train reward", "truncation_rate": "truncated", "equal_reward_groups": "equal groups",
              "response_length_mean": "response tokens"}
    for key, label in labels.items():
        if key in windows:
            w = windows[key]
            lines.append(f"  {label:<16} {w['first']:.3f} -> {w['last']:.3f} (mean of first vs last {w['steps']} "
                         f"step{'s' if w['steps'] != 1 else ''})")
    if not windows and summary.get("reward_first") is not None:
        lines.append(f"  train reward     {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}")
    if "eval_before" in summary:
        delta = 100 * (summary["eval_after"] - summary["eval_before"])
        lines.append(f"  held-out greedy  {summary['eval_before']:.3f} -> {summary['eval_after']:.3f} "
                     f"({delta:+.1f} points)")
        if "eval_before_ci95" in summary:
            b, a = summary["eval_before_ci95"], summary["eval_after_ci95"]
            verdict = ("outside the before's interval: more than the noise of this many prompts"
                       if summary["eval_change_outside_ci95"] else
                       "inside the before's interval: within the noise of this many prompts")
            lines.append(f"                   95% intervals (Wilson, {summary['eval_prompts']} prompts): before "
                         f"[{b[0]:.3f}, {b[1]:.3f}], after [{a[0]:.3f}, {a[1]:.3f}]; the after is {verdict}")
        lines.append("                   predictions/step_<N>.jsonl: each held-out prompt's greedy completion and "
                     "reward (heldout.jsonl: the rows)")
    dropped = (summary.get("buffer") or {}).get("dropped") or {}
    if dropped:
        lines.append("  dropped samples  " + ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())))
    lines.append(f"  run folder       {run_dir} (metrics/, logs/, reward_curve.png, summary.json)")
    return "\n".join(lines)
