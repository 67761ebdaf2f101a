"""What a 2-process (and a 1-process) FSDP2 trainer publishes from its sharded state -- each parameter
all-gathered only when the sender reaches it -- is exactly what the whole-model gather (full_state_dict) gives: the
same names in the same order, dtypes, shapes and bytes, staged into the same buckets. For an untied and a tied
model, LoRA (adapters only) and activation checkpointing, each after a real RL step so master weights and publish
dtype differ."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlfleet.config import Config, parse_config
from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer.distributed_exit import leave_distributed
from tests.support.ranks import spawn_ranks
from tests.support.tiny_model import make_tiny_model

BUCKET = 4096                  # small buckets: tensors span buckets, each dtype ends in a partial one
VARIANTS: dict[str, dict[str, Any]] = {
    "untied": {},
    "tied": {},
    "lora": {"lora": {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "v_proj"]}},
    "activation_checkpointing": {"activation_checkpointing": True},
}


def config(run_dir: Path, model_dir: Path, world: int, trainer: dict[str, Any]) -> Config:
    return parse_config({
        "run": {"dir": str(run_dir)}, "model": {"path": str(model_dir), "dtype": "bfloat16"},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2, "sampling": {"temperature": 0.9}},
        "trainer": {"world_size": world, "groups_per_step": 4, "minibatches": 2, "lr": 1e-2, "grad_clip": 0.5,
                    "tis": {"mode": "tis", "clip": 1.2}, **trainer},
    })


def make_untied_model(path: Path) -> Path:
    """The tiny model with its own lm_head (the tiny model ties it to the embeddings)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    make_tiny_model(path)
    tied = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    cfg = tied.config
    cfg.tie_word_embeddings = False
    untied = LlamaForCausalLM(cfg)
    untied.load_state_dict(tied.state_dict())
    with torch.no_grad():
        untied.lm_head.weight.copy_(tied.lm_head.weight + 0.01 * torch.randn(tied.lm_head.weight.shape))
    untied.save_pretrained(str(path), safe_serialization=True)
    return path


def _worker(rank: int, world: int, port: int, models: dict[str, str], run_dir: str, out: str) -> None:
    from rlfleet.services.trainer.algorithms import resolve
    from rlfleet.services.trainer.backends.fsdp import FsdpBackend
    from rlfleet.services.trainer.batch import rank_groups
    from rlfleet.services.trainer.collectives import broadcast_bytes
    from rlfleet.services.trainer.step import StepContext
    from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors
    from rlfleet.v1 import buffer_pb2
    from rlfleet.weights.tied import tied_aliases
    from tests.unit.test_trainer_fsdp import batch_for

    torch.set_num_threads(1)
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))          # a rank out of step fails, never hangs
    report: dict[str, Any] = {}
    try:
        for variant, trainer in VARIANTS.items():
            cfg = config(Path(run_dir) / variant, Path(models[variant]), world, trainer)
            backend = FsdpBackend(cfg, rank, world, device)
            advantage_fn, loss_fn = resolve(cfg.trainer)
            ctx = StepContext(advantage_fn, loss_fn, (), temperature=0.9, minibatches=2, grad_clip=0.5,
                              world_size=world, device=device, pad_id=backend.pad_id)
            data = broadcast_bytes(batch_for(0).SerializeToString() if rank == 0 else None, device)
            backend.train_step(rank_groups(buffer_pb2.Batch.FromString(data), rank, world, 2), 0, ctx)
            tied = tied_aliases(backend.model)                     # sent once, under their source's name
            full = {n: t for n, t in backend.full_state_dict().items() if n not in tied}   # the whole-model gather
            state = backend.sharded_state()
            if rank != 0:
                state.drain()                                      # its half of every per-parameter gather
                state.drain()
                continue
            streamed = stage_tensors(1, 0, state, BUCKET, "x:0")   # gathers while staging
            whole = stage_tensors(1, 0, full.items(), BUCKET, "x:0")
            direct = list(state)                                   # (name, tensor) as a sender sees them
            report[variant] = {
                "full": [[n, str(t.dtype), list(t.shape)] for n, t in full.items()],
                "sharded": [[n, str(t.dtype), list(t.shape)] for n, t in direct],
                "values_equal": [n for n, t in direct if n in full and torch.equal(t, full[n])],
                "manifest_equal": streamed.manifest == whole.manifest,
                "flat_equal": bytes(streamed.flat) == bytes(whole.flat),
                "hashes": {e.name: e.xxh64 for e in streamed.manifest.tensors},
                "trainable": [n for n, p in backend.model.named_parameters() if p.requires_grad],
            }
            del full, direct
        dist.barrier()
        if rank == 0:
            Path(out, "report.json").write_text(json.dumps(report))
    finally:
        leave_distributed()



@pytest.fixture(scope="module", params=[2, 1], ids=["2_ranks", "1_rank"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """world 2: each parameter all-gathered as the sender reaches it; world 1 (a one-device mesh): copied from the
    local shard, which is the whole tensor, without a collective."""
    world = int(request.param)
    tmp = tmp_path_factory.mktemp("sharded_publish")
    tied = make_tiny_model(tmp / "tied")
    models = {v: str(tied) for v in VARIANTS} | {"untied": str(make_untied_model(tmp / "untied"))}
    spawn_ranks(_worker, (world, free_ports(1)[0], models, str(tmp / "run"), str(tmp)), world)
    return json.loads((tmp / "report.json").read_text())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sharded_publish_equals_full_state_dict(report: dict[str, Any], variant: str) -> None:
    r = report[variant]
    assert r["sharded"] == r["full"]                                   # names in order, dtypes, shapes
    assert r["values_equal"] == [n for n, _, _ in r["full"]]           # every tensor bit-identical
    assert r["manifest_equal"] and r["flat_equal"]                     # same buckets, hashes, digest
    dtypes = {d for _, d, _ in r["full"]}
    assert dtypes == {"torch.bfloat16"}                                # fp32 masters published in model.dtype
    names = [n for n, _, _ in r["full"]]
    if variant == "lora":
        assert names and all(n.endswith((".lora_A", ".lora_B")) for n in names)
        assert sorted(names) == sorted(r["trainable"])                 # exactly the adapters, nothing frozen
    else:
        assert "model.embed_tokens.weight" in names and len(names) > 10
        assert any(n.endswith("self_attn.q_proj.weight") for n in names)
    if variant == "untied":                                            # its own lm_head is published
        assert r["hashes"]["lm_head.weight"] != r["hashes"]["model.embed_tokens.weight"]
    if variant == "tied":                                              # a tied lm_head is sent once, as the embedding
        assert "lm_head.weight" not in r["hashes"] and "model.embed_tokens.weight" in r["hashes"]
