"""Models larger than a device: each FSDP rank builds the model on the meta device and reads only its own rows
from the safetensors files. What the ranks hold together is the file, bit for bit (uneven first dims included),
the rotary buffers are rebuilt, and the sharded model computes what the plain HF model computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from rlfleet.config import parse_config
from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed
from rlfleet.services.trainer.backends.shard_loading import ShardLoadError, _row_range, load_shards
from rlfleet.services.trainer.distributed_exit import leave_distributed
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model

IDS = [[1, 5, 6, 14, 7, 9, 3], [1, 9, 9, 4, 2, 8, 8]]


def _worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    cfg = parse_config({"model": {"path": model_dir}, "trainer": {"world_size": world, "groups_per_step": 2},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2}})
    device = torch.device("cpu")
    init_distributed(f"127.0.0.1:{port}", rank, world, device)
    try:
        backend = FsdpBackend(cfg, rank, world, device)
        assert backend.loaded_by_shards
        local = {n: p.to_local().shape[0] for n, p in backend.model.named_parameters()}
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor(IDS)).logits       # [2, 7, V], every rank joins
        state = backend.full_state_dict()
        if rank == 0:
            torch.save({"state": state, "logits": logits}, Path(out) / "held.pt")
        Path(out, f"rows{rank}.json").write_text(json.dumps(local))
        dist.barrier()          # tear down together; the group's threads end in spawn_ranks (distributed_exit.py:
                                # left to interpreter teardown they aborted a rank now and then)
    finally:
        leave_distributed()


@pytest.mark.timeout(600)
def test_two_ranks_read_only_their_rows_and_hold_the_model_exactly(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = make_tiny_model(tmp_path / "model")
    spawn_ranks(_worker, (2, free_ports(1)[0], str(model_dir), str(tmp_path)), 2)
    held = torch.load(tmp_path / "held.pt", weights_only=True)
    files = load_file(str(model_dir / "model.safetensors"))
    for name, tensor in files.items():
        assert torch.equal(held["state"][name], tensor), name
    rows = [json.loads((tmp_path / f"rows{r}.json").read_text()) for r in range(2)]
    for name in rows[0]:
        n = files[name].shape[0]
        assert rows[0][name] + rows[1][name] == n, name
        assert rows[0][name] == -(-n // 2), f"{name}: rank 0 holds the first ceil(n/2) rows"
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(IDS)).logits
    torch.testing.assert_close(held["logits"], expected, atol=1e-5, rtol=0)


def test_row_ranges_follow_torch_chunk() -> None:
    for n in (0, 1, 7, 19, 64):
        for world in (1, 2, 3, 8):
            parts = torch.arange(n).chunk(world) if n else ()
            expected = [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]
            got = [_row_range(n, r, world) for r in range(world)]
            assert [g for g in got if g[1] > g[0]] == expected, (n, world)


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from rlfleet.services.trainer.backends.shard_loading import build_meta_model

    model_dir = make_tiny_model(tmp_path / "model")
    weights = load_file(str(model_dir / "model.safetensors"))
    dropped = sorted(weights)[0]
    save_file({k: v for k, v in weights.items() if k != dropped}, str(model_dir / "model.safetensors"))
    model = build_meta_model(model_dir)
    with pytest.raises(ShardLoadError, match=dropped):
        load_shards(model, model_dir, 0, 1, torch.device("cpu"))
