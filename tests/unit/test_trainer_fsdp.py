"""FSDP2 over gloo: 2 ranks train exactly like 1 rank on the same batches; resuming a checkpoint continues
bit-identically (weights, optimizer, RNG, step, version); leaving the group ends its threads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from rlfleet.config import Config, parse_config
from rlfleet.runtime.ports import free_ports
from rlfleet.sample import Sample
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.batch import rank_groups
from rlfleet.services.trainer.collectives import broadcast_bytes
from rlfleet.services.trainer.distributed_exit import collective_threads, leave_distributed
from rlfleet.services.trainer.step import StepContext
from rlfleet.v1 import buffer_pb2
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model

STEPS = 3
GROUPS = 4


def _config(run_dir: Path, model_dir: Path, world: int) -> Config:
    return parse_config({
        "run": {"dir": str(run_dir)}, "model": {"path": str(model_dir)},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2, "sampling": {"temperature": 0.9}},
        "trainer": {"world_size": world, "groups_per_step": GROUPS, "minibatches": 2, "lr": 1e-3, "grad_clip": 0.5,
                    "weight_decay": 0.01, "tis": {"mode": "tis", "clip": 1.2}, "keep_checkpoints": 1},
    })


def batch_for(step: int) -> buffer_pb2.Batch:
    """GROUPS groups of 2 samples with different lengths and rewards; rollout logprobs off by a little."""
    g = torch.Generator().manual_seed(step)
    samples, gids = [], []
    for gi in range(GROUPS):
        gid = f"s{step}g{gi}"
        gids.append(gid)
        for i in range(2):
            p, t = 2 + (gi + i) % 3, 2 + (gi * 2 + i) % 4
            ids = torch.randint(3, 19, (p + t,), generator=g).tolist()
            samples.append(Sample(group_id=gid, index=i, group_size=2, prompt_ids=[1, *ids[:p]],
                                  response_ids=ids[p:], rollout_logprobs=(-2.5 - torch.rand(t, generator=g)).tolist(),
                                  loss_mask=[1] * (t - 1) + [i % 2], reward=float(torch.rand(1, generator=g)))
                           .to_proto())
    return buffer_pb2.Batch(step=step, samples=samples, group_ids=gids, complete=True)


def _worker(rank: int, world: int, port: int, run_dir: str, model_dir: str, mode: str, out: str) -> None:
    torch.set_num_threads(1)
    init_distributed(f"127.0.0.1:{port}", rank, world, torch.device("cpu"))
    try:
        _train(rank, world, Path(run_dir), Path(model_dir), mode, Path(out))
        dist.barrier()          # tear down together
        before = collective_threads()
    finally:
        leave_distributed()
    Path(out, f"threads{rank}.json").write_text(json.dumps({"before": before, "after": collective_threads()}))


def _train(rank: int, world: int, run_dir: Path, model_dir: Path, mode: str, out: Path) -> None:
    cfg, device = _config(run_dir, model_dir, world), torch.device("cpu")
    torch.manual_seed(100 + rank)
    backend = FsdpBackend(cfg, rank, world, device)
    advantage_fn, loss_fn = resolve(cfg.trainer)
    ctx = StepContext(advantage_fn, loss_fn, (), temperature=0.9, minibatches=2, grad_clip=0.5, world_size=world,
                      device=device, pad_id=backend.pad_id)
    start, version = 0, 0
    if mode == "resume":
        info = checkpoint.latest(run_dir)
        assert info is not None
        checkpoint.load(info, backend.model, backend.optimizer, device)
        start, version = info.step + 1, info.version
    records, draws = [], []
    for step in range(start, STEPS):
        data = broadcast_bytes(batch_for(step).SerializeToString() if rank == 0 else None, device)
        groups = rank_groups(buffer_pb2.Batch.FromString(data), rank, world, 2)
        records.append({"step": step, **backend.train_step(groups, step, ctx)})
        draws.append(torch.rand(2).tolist())            # stands in for dropout: consumes the RNG
        version += 1
        if mode == "checkpoint" and step == 0:
            checkpoint.save(run_dir, step, version, backend.model, backend.optimizer, device, keep=1)
    state = backend.full_state_dict()
    if rank == 0:
        save_file({k: v.clone() for k, v in state.items()}, str(out / "weights.safetensors"))
    (out / f"records{rank}.json").write_text(json.dumps({"records": records, "draws": draws, "version": version}))


def _spawn(world: int, run_dir: Path, model_dir: Path, mode: str, out: Path) -> dict:
    out.mkdir(parents=True)
    spawn_ranks(_worker, (world, free_ports(1)[0], str(run_dir), str(model_dir), mode, str(out)), world)
    return {"weights": load_file(str(out / "weights.safetensors")),
            **{f"rank{r}": json.loads((out / f"records{r}.json").read_text()) for r in range(world)},
            **{f"threads{r}": json.loads((out / f"threads{r}.json").read_text()) for r in range(world)}}


@pytest.mark.timeout(900)
def test_two_ranks_equal_one_rank_and_resume_is_bit_identical(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "model")
    two = _spawn(2, tmp_path / "run2", model_dir, "checkpoint", tmp_path / "out2")
    one = _spawn(1, tmp_path / "run1", model_dir, "train", tmp_path / "out1")

    # same loss and metrics, same weights (to 1e-5)
    for a, b in zip(one["rank0"]["records"], two["rank0"]["records"], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert two["rank0"]["records"] == two["rank1"]["records"]          # every rank reports the global metrics
    assert one["rank0"]["records"][0]["samples"] == 2 * GROUPS
    assert one["weights"].keys() == two["weights"].keys()
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, atol=1e-5, rtol=0, msg=name)
    initial = load_file(str(model_dir / "model.safetensors"))
    assert any(not torch.equal(initial[k], two["weights"][k]) for k in initial)   # it did train

    ckpt = checkpoint.latest(tmp_path / "run2")
    assert ckpt is not None and (ckpt.step, ckpt.version, ckpt.world_size) == (0, 1, 2)
    assert ckpt.path.name == "step_00000000"
    assert not list((tmp_path / "run2" / "checkpoints").glob(".tmp-*"))

    resumed = _spawn(2, tmp_path / "run2", model_dir, "resume", tmp_path / "out3")
    for name, w in two["weights"].items():
        assert torch.equal(resumed["weights"][name], w), name
    for r in (0, 1):
        assert resumed[f"rank{r}"]["records"] == two[f"rank{r}"]["records"][1:]
        assert resumed[f"rank{r}"]["draws"] == two[f"rank{r}"]["draws"][1:]
        assert resumed[f"rank{r}"]["version"] == two[f"rank{r}"]["version"] == STEPS

    # leaving the group ends its threads (gloo's workers and TCP loop, the store) before the process exits: left to
    # the interpreter's teardown they aborted a rank now and then, after its work was done
    for run, world in ((one, 1), (two, 2), (resumed, 2)):
        for r in range(world):
            assert "pt_gloo_runloop" in run[f"threads{r}"]["before"]       # the check sees them while they run
            assert run[f"threads{r}"]["after"] == [], (r, run[f"threads{r}"])
