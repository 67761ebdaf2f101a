"""A checkpoint that cannot be written (a full disk) fails with one clear error that says why and what is kept, leaves
no partial folder holding the space, keeps the previous checkpoint, and the next save succeeds once space returns.

The full disk is real to the writer: the child process runs a real one-rank gloo group and torch DCP, and its file
size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so writes past it fail with EFBIG) is lowered around one save.
Found in a run (2026-12-02): DCP's CheckpointException is a BaseException, so it escaped the service's handler and
the trainer died on a torch traceback ("unexpected pos 704 vs 598") with its partial folder left on the full disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(run_dir: str) -> None:
    """Save step 1, fail step 2 under a 64 KiB file-size limit, then save step 2 with the limit lifted."""
    import resource

    import torch
    import torch.distributed as dist

    from rlfleet.services.trainer import checkpoint
    from rlfleet.services.trainer.distributed_exit import leave_distributed

    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)                      # 257 KiB of weights, 514 KiB more of AdamW state
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    cpu = torch.device("cpu")
    checkpoint.save(Path(run_dir), 1, 1, model, opt, cpu, keep=3)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    error = ""
    try:
        checkpoint.save(Path(run_dir), 2, 2, model, opt, cpu, keep=3)
    except checkpoint.CheckpointError as exc:
        error = str(exc)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    root = checkpoint.checkpoints_dir(Path(run_dir))
    after_failure = sorted(p.name for p in root.iterdir())
    latest = checkpoint.latest(Path(run_dir))
    checkpoint.save(Path(run_dir), 2, 2, model, opt, cpu, keep=3)
    again = checkpoint.latest(Path(run_dir))
    leave_distributed()
    print(json.dumps({"error": error, "after_failure": after_failure, "latest": latest.step if latest else None,
                      "again": again.step if again else None}))


def test_a_checkpoint_on_a_full_disk_fails_clearly_and_keeps_the_last_one(tmp_path: Path) -> None:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.unit.test_checkpoint_disk_full import child; " \
           "child(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    error = got["error"]
    assert error.startswith("checkpoint of step 2 could not be written to "), error
    assert "MiB free on its disk" in error and "--resume" in error, error
    assert "Traceback" not in error and "\n" not in error.strip()
    assert got["after_failure"] == ["step_00000001"]         # no .tmp- folder left holding the space
    assert got["latest"] == 1                                # the previous checkpoint is intact and found
    assert got["again"] == 2                                 # space back: the same step saves
