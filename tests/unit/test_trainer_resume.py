"""Exact resume and resharding with the FSDP2 backend on fixed batches:
- a trainer SIGKILLed in the middle of a step, resumed from its last checkpoint, ends with weights bit-identical to an
  uninterrupted run (model, optimizer, cosine LR schedule, RNG all restored);
- REINFORCE++ (batch whitening over ranks) with sequence packing: 2 processes equal 1 process (to 1e-5), and a
  checkpoint written by 2 processes resumes on 1 and one written by 1 resumes on 2."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from rlfleet.config import Config, parse_config
from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.batch import rank_groups
from rlfleet.services.trainer.collectives import broadcast_bytes
from rlfleet.services.trainer.distributed_exit import leave_distributed
from rlfleet.services.trainer.step import StepContext
from rlfleet.v1 import buffer_pb2
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model
from tests.unit.test_trainer_fsdp import batch_for

STEPS = 3


def _config(run_dir: str, model_dir: str, world: int, algorithm: str, packing: bool) -> Config:
    return parse_config({
        "run": {"dir": run_dir}, "model": {"path": model_dir},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2, "sampling": {"temperature": 0.9}},
        "trainer": {"world_size": world, "groups_per_step": 4, "minibatches": 2, "lr": 1e-3, "grad_clip": 0.5,
                    "steps": STEPS, "algorithm": algorithm, "weight_decay": 0.01, "keep_checkpoints": 1,
                    "tis": {"mode": "tis", "clip": 1.2}, "packing": {"enabled": packing, "max_tokens": 16},
                    "scheduler": {"kind": "cosine", "warmup_steps": 1, "min_ratio": 0.1}},
    })


class KillAt:
    """Hook: SIGKILL this process in the middle of step `step` (after backward, before the optimizer step)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def before_step(self, step: int, batch: object) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def _worker(rank: int, world: int, port: int, run_dir: str, model_dir: str, out: str, algorithm: str,
            packing: bool, save_every: bool, resume: bool, kill_step: int) -> None:
    torch.set_num_threads(1)
    cfg, device = _config(run_dir, model_dir, world, algorithm, packing), torch.device("cpu")
    init_distributed(f"127.0.0.1:{port}", rank, world, device)
    try:
        torch.manual_seed(100 + rank)
        hooks = [KillAt(kill_step)] if kill_step >= 0 else []
        backend = FsdpBackend(cfg, rank, world, device, hooks)
        advantage_fn, loss_fn = resolve(cfg.trainer)
        ctx = StepContext(advantage_fn, loss_fn, hooks, temperature=0.9, minibatches=2, grad_clip=0.5,
                          world_size=world, device=device, pad_id=backend.pad_id)
        start = 0
        if resume:
            info = checkpoint.latest(Path(run_dir))
            assert info is not None
            backend.load_checkpoint(info)
            start = info.step + 1
        records = []
        for step in range(start, STEPS):
            data = broadcast_bytes(batch_for(step).SerializeToString() if rank == 0 else None, device)
            groups = rank_groups(buffer_pb2.Batch.FromString(data), rank, world, 2)
            records.append({"step": step, **backend.train_step(groups, step, ctx)})
            if save_every or step == 0:
                backend.save_checkpoint(Path(run_dir), step, step + 1, keep=1)
        state = backend.full_state_dict()
        if rank == 0:
            save_file({k: v.clone() for k, v in state.items()}, str(Path(out) / "weights.safetensors"))
            Path(out, "records.json").write_text(json.dumps(records))
        dist.barrier()          # tear down together: a rank destroying its group while the other still uses it
    finally:
        leave_distributed()



def _spawn(world: int, run_dir: Path, model_dir: Path, out: Path, algorithm: str = "grpo", packing: bool = False,
           save_every: bool = False, resume: bool = False, kill_step: int = -1) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    spawn_ranks(_worker, (world, free_ports(1)[0], str(run_dir), str(model_dir), str(out), algorithm, packing,
                          save_every, resume, kill_step), world)
    return {"weights": load_file(str(out / "weights.safetensors")),
            "records": json.loads((out / "records.json").read_text())}


@pytest.mark.timeout(900)
def test_killed_mid_step_then_resumed_is_bit_identical(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "model")
    whole = _spawn(1, tmp_path / "whole", model_dir, tmp_path / "o1")
    with pytest.raises(mp.ProcessExitedException):
        _spawn(1, tmp_path / "killed", model_dir, tmp_path / "o2", save_every=True, kill_step=2)
    info = checkpoint.latest(tmp_path / "killed")
    assert info is not None and info.step == 1                  # step 2 died before its checkpoint
    resumed = _spawn(1, tmp_path / "killed", model_dir, tmp_path / "o3", save_every=True, resume=True)
    assert resumed["records"] == whole["records"][2:]             # same loss, metrics and learning rate
    assert whole["weights"].keys() == resumed["weights"].keys()
    for name, w in whole["weights"].items():
        assert torch.equal(resumed["weights"][name], w), name


@pytest.mark.timeout(1200)
def test_two_ranks_equal_one_and_checkpoints_reshard(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "model")
    kw: dict[str, Any] = {"algorithm": "reinforce_pp", "packing": True}
    one = _spawn(1, tmp_path / "run1", model_dir, tmp_path / "o1", **kw)
    two = _spawn(2, tmp_path / "run2", model_dir, tmp_path / "o2", **kw)

    def same(a: dict, b: dict) -> None:
        for x, y in zip(a["records"], b["records"], strict=True):
            assert x.keys() == y.keys()
            for key in x:
                assert x[key] == pytest.approx(y[key], abs=1e-5), key
        for name, w in a["weights"].items():
            torch.testing.assert_close(b["weights"][name], w, atol=1e-5, rtol=0, msg=name)

    same(one, two)
    initial = load_file(str(model_dir / "model.safetensors"))
    assert any(not torch.equal(initial[k], one["weights"][k]) for k in initial)

    two_to_one = _spawn(1, tmp_path / "run2", model_dir, tmp_path / "o3", resume=True, **kw)   # written by 2
    same({"records": one["records"][1:], "weights": one["weights"]}, two_to_one)
    one_to_two = _spawn(2, tmp_path / "run1", model_dir, tmp_path / "o4", resume=True, **kw)   # written by 1
    same({"records": one["records"][1:], "weights": one["weights"]}, one_to_two)
