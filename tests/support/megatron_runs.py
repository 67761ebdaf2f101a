"""Spawned trainer ranks for the Megatron tests: train a few steps of fixed batches with the FSDP or the Megatron
backend (the latter behind the CPU shims) and write metrics and the gathered HF weights."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlfleet.config import Config, parse_config
from rlfleet.runtime.ports import free_port
from rlfleet.sample import Sample
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.backends import backend_spec, make_backend
from rlfleet.services.trainer.backends.fsdp import init_distributed
from rlfleet.services.trainer.batch import rank_groups
from rlfleet.services.trainer.collectives import broadcast_bytes
from rlfleet.services.trainer.distributed_exit import collective_threads, leave_distributed
from rlfleet.services.trainer.step import StepContext
from rlfleet.v1 import buffer_pb2
from tests.support.ranks import spawn_ranks

GROUPS = 4
MINIBATCHES = 2


def run_config(run_dir: Path, model_dir: Path, backend: str, world: int, tp: int = 1, pp: int = 1,
               microbatches: int = 1) -> Config:
    return parse_config({
        "run": {"dir": str(run_dir)}, "model": {"path": str(model_dir)},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2, "sampling": {"temperature": 0.9}},
        "trainer": {"backend": backend, "world_size": world, "groups_per_step": GROUPS, "minibatches": MINIBATCHES,
                    "lr": 1e-3, "grad_clip": 0.5, "weight_decay": 0.01, "tis": {"mode": "tis", "clip": 1.2},
                    "keep_checkpoints": 1,
                    "megatron": {"tensor_parallel": tp, "pipeline_parallel": pp, "microbatches": microbatches}},
    })


def batch_for(step: int, vocab: int) -> buffer_pb2.Batch:
    """GROUPS groups of 2 samples with different lengths and rewards; rollout logprobs off by a little."""
    g = torch.Generator().manual_seed(step)
    samples, gids = [], []
    for gi in range(GROUPS):
        gid = f"s{step}g{gi}"
        gids.append(gid)
        for i in range(2):
            p, t = 2 + (gi + i) % 3, 2 + (gi * 2 + i) % 4
            ids = torch.randint(3, vocab, (p + t,), generator=g).tolist()
            samples.append(Sample(group_id=gid, index=i, group_size=2, prompt_ids=[1, *ids[:p]],
                                  response_ids=ids[p:], rollout_logprobs=(-2.5 - torch.rand(t, generator=g)).tolist(),
                                  loss_mask=[1] * (t - 1) + [i % 2], reward=float(torch.rand(1, generator=g)))
                           .to_proto())
    return buffer_pb2.Batch(step=step, samples=samples, group_ids=gids, complete=True)


def _train(backend: Any, cfg: Config, rank: int, start: int, steps: int, vocab: int,
           checkpoint_at: int | None) -> list[dict[str, float]]:
    device = torch.device("cpu")
    advantage_fn, loss_fn = resolve(cfg.trainer)
    ctx = StepContext(advantage_fn, loss_fn, (), temperature=0.9, minibatches=MINIBATCHES, grad_clip=0.5,
                      world_size=cfg.trainer.world_size, device=device, pad_id=backend.pad_id)
    data_rank, data_world = getattr(backend, "data_rank", rank), getattr(backend, "data_world", cfg.trainer.world_size)
    records = []
    for step in range(start, steps):
        data = broadcast_bytes(batch_for(step, vocab).SerializeToString() if rank == 0 else None, device)
        groups = rank_groups(buffer_pb2.Batch.FromString(data), data_rank, data_world, MINIBATCHES)
        records.append({"step": step, **backend.train_step(groups, step, ctx)})
        if checkpoint_at == step:
            backend.save_checkpoint(cfg.run_dir, step, step + 1, keep=1)
    return records


def _worker(rank: int, world: int, port: int, spec: dict[str, Any]) -> None:
    """One rank: train (in _train_rank's frame, which has returned when the rank leaves), leave the process group
    with the backend's release, then record the collective threads still alive."""
    torch.set_num_threads(1)
    init_distributed(f"127.0.0.1:{port}", rank, world, torch.device("cpu"))
    try:
        _train_rank(rank, world, spec)
    finally:
        leave_distributed(backend_spec(spec["backend"]).release)
    (Path(spec["out"]) / f"threads{rank}.json").write_text(json.dumps(collective_threads()))


def _train_rank(rank: int, world: int, spec: dict[str, Any]) -> None:
    cfg = run_config(Path(spec["run_dir"]), Path(spec["model_dir"]), spec["backend"], world, spec["tp"], spec["pp"],
                     spec["microbatches"])
    out = Path(spec["out"])
    shims: AbstractContextManager[None]
    if spec["backend"] == "megatron":
        from tests.support.megatron_cpu_shims import megatron_on_cpu
        shims = megatron_on_cpu()
    else:
        import contextlib
        shims = contextlib.nullcontext()
    with shims:
        torch.manual_seed(100 + rank)
        backend = make_backend(cfg, rank, world, torch.device("cpu"))
        records = _train(backend, cfg, rank, 0, spec["steps"], spec["vocab"], spec.get("checkpoint_at"))
        state = backend.full_state_dict()
        result: dict[str, Any] = {"records": records}
        if spec.get("checkpoint_at") is not None:                   # resume from it in a fresh backend
            resumed = make_backend(cfg, rank, world, torch.device("cpu"))
            info = checkpoint.latest(cfg.run_dir)
            assert info is not None
            resumed.load_checkpoint(info)
            result["resumed_records"] = _train(resumed, cfg, rank, info.step + 1, spec["steps"], spec["vocab"],
                                               None)
            resumed_state = resumed.full_state_dict()
            if rank == 0:
                save_file({k: v.clone().contiguous() for k, v in resumed_state.items()},
                          str(out / "resumed.safetensors"))
    if rank == 0:
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(out / "weights.safetensors"))
        (out / "order.json").write_text(json.dumps(list(state)))
    (out / f"records{rank}.json").write_text(json.dumps(result))


def spawn_run(out: Path, model_dir: Path, backend: str, world: int, vocab: int, steps: int = 2, tp: int = 1,
              pp: int = 1, microbatches: int = 1, checkpoint_at: int | None = None) -> dict[str, Any]:
    """Train `steps` steps on `world` processes; returns weights (rank 0), order, each rank's records and the
    collective threads each rank still had after leaving the process group (threads<r>)."""
    out.mkdir(parents=True)
    spec = {"run_dir": str(out / "run"), "model_dir": str(model_dir), "backend": backend, "tp": tp, "pp": pp,
            "microbatches": microbatches, "out": str(out), "steps": steps, "vocab": vocab,
            "checkpoint_at": checkpoint_at}
    spawn_ranks(_worker, (world, free_port(), spec), world)
    result: dict[str, Any] = {"weights": load_file(str(out / "weights.safetensors")),
                              "order": json.loads((out / "order.json").read_text())}
    if (out / "resumed.safetensors").exists():
        result["resumed"] = load_file(str(out / "resumed.safetensors"))
    for r in range(world):
        result[f"rank{r}"] = json.loads((out / f"records{r}.json").read_text())
        result[f"threads{r}"] = json.loads((out / f"threads{r}.json").read_text())
    return result


def make_tiny_qwen2(path: Path, seed: int = 0, vocab: int = 19, tied: bool = False) -> Path:
    """A ~20k-parameter random Qwen2 (GQA 4 heads / 2 kv heads, QKV bias, untied unless asked), saved to path."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():             # larger than the default init, so that logits differ visibly
            p.normal_(0.0, 0.2)
    model.save_pretrained(str(path), safe_serialization=True)
    return Path(path)
