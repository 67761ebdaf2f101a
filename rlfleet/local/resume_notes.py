"""What the console says around an interruption: on Ctrl-C, what the run folder keeps and the exact command that
resumes it; on `--resume`, the step the run continues from."""

from __future__ import annotations

import shlex
from pathlib import Path

from rlfleet.run_dir.committed_ids import complete_step


def latest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint folder of a run and its step (0-based, as metrics and TensorBoard count)."""
    root = Path(run_dir) / "checkpoints"
    best: tuple[Path, int] | None = None
    for path in sorted(root.glob("step_*")) if root.is_dir() else []:
        step = complete_step(path)
        if step is not None and (best is None or step > best[1]):
            best = (path, step)
    return best


def resume_command(config: str, sets: list[str]) -> str:
    """The command line that resumes this run: the same config and overrides, plus --resume."""
    parts = ["rlfleet", "run", config]
    for s in sets:
        parts += ["--set", s]
    return shlex.join([*parts, "--resume"])


def interrupted_note(run_dir: Path, config: str, sets: list[str], total_steps: int) -> str:
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        saved = ("no checkpoint yet: a resume trains from step 0 again; the buffer keeps the samples it stored "
                 "(they are trained, not generated again)")
    else:
        path, step = ckpt
        saved = (f"checkpoint {path.name} (step {step}: {step + 1} of {total_steps} steps trained), the buffer's "
                 "samples, metrics/ and logs/")
    return (f"rlfleet: interrupted; every service stopped. Saved in {run_dir}: {saved}.\n"
            f"  resume with: {resume_command(config, sets)}")


def resumed_note(run_dir: Path, total_steps: int) -> str:
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return f"rlfleet: resuming {run_dir}: no complete checkpoint, so training starts at step 0 of {total_steps}"
    path, step = ckpt
    return (f"rlfleet: resuming {run_dir} from checkpoint {path.name}: steps 0-{step} trained, continuing at step "
            f"{step + 1} ({total_steps} steps in all)")
