"""Trainer step time with the FSDP2 backend: 1 vs 2 processes, and padded vs packed vs shared-prompt rows (a group's
prompt computed once: rlfleet/services/trainer/fast_paths/shared_prompt.py), in the same run. Prints, never asserts.

The same fixed batches (GRPO, `--groups` groups of 8 samples with prompt+response lengths spread between
`--min-len` and `--max-len` tokens, like RL rollouts whose responses stop at different places) are trained by each
configuration: {1, 2} processes x {padded, packed, shared}. Each process uses one torch thread (2 processes use 2
cores).
Every configuration runs `--warmup` untimed steps, then `--steps` timed ones; the median step time is reported, with
ratios against "1 process, padded". Rounds alternate configurations so ratios compare runs seconds apart.
Model: a llama of `--hidden` x `--layers` (vocab 19, the addition recipe's shape family).
`--precisions fp32,bf16` adds bf16 compute (trainer.precision; on CPU its attention runs in float32:
rlfleet/services/trainer/fast_paths/cpu_attention.py), `--processes 1` and `--layouts shared` narrow the grid.
Run: python bench/trainer_step.py [--rounds 2] [--steps 5] [--hidden 256] [--layers 4] [--groups 8]
The addition example's shape: --hidden 128 --layers 4 --groups 32 --min-len 10 --max-len 12 --prompt-len 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.config import parse_config  # noqa: E402
from rlfleet.runtime.ports import free_ports  # noqa: E402
from rlfleet.sample import Sample  # noqa: E402
from rlfleet.services.trainer.algorithms import resolve  # noqa: E402
from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed  # noqa: E402
from rlfleet.services.trainer.batch import rank_groups  # noqa: E402
from rlfleet.services.trainer.step import StepContext  # noqa: E402
from rlfleet.v1 import buffer_pb2  # noqa: E402

GROUP = 8


def make_batch(step: int, groups: int, min_len: int, max_len: int, prompt_len: int = 0) -> buffer_pb2.Batch:
    g = torch.Generator().manual_seed(step)
    samples, gids = [], []
    for gi in range(groups):
        gid = f"s{step}g{gi}"
        gids.append(gid)
        n = prompt_len or int(torch.randint(4, 12, (1,), generator=g))
        prompt = torch.randint(3, 19, (n,), generator=g).tolist()
        for i in range(GROUP):
            total = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
            t = max(total - len(prompt), 1)
            resp = torch.randint(3, 19, (t,), generator=g).tolist()
            samples.append(Sample(group_id=gid, index=i, group_size=GROUP, prompt_ids=prompt, response_ids=resp,
                                  rollout_logprobs=[-2.5] * t, reward=float(i % 2)).to_proto())
    return buffer_pb2.Batch(step=step, samples=samples, group_ids=gids, complete=True)


def _worker(rank: int, world: int, port: int, model_dir: str, layout: str, precision: str, args: dict,
            out: str) -> None:
    torch.set_num_threads(1)
    cfg = parse_config({
        "run": {"dir": str(Path(out).parent / "run")}, "model": {"path": model_dir},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": GROUP},
        "trainer": {"world_size": world, "groups_per_step": args["groups"], "lr": 1e-4, "precision": precision,
                    "packing": {"enabled": layout == "packed", "max_tokens": args["pack_tokens"]}},
        "perf": {"shared_prompt": layout == "shared"},
    })
    device = torch.device("cpu")
    init_distributed(f"127.0.0.1:{port}", rank, world, device)
    try:
        backend = FsdpBackend(cfg, rank, world, device)
        adv, loss = resolve(cfg.trainer)
        ctx = StepContext(adv, loss, (), temperature=1.0, minibatches=1, grad_clip=1.0, world_size=world,
                          device=device, pad_id=backend.pad_id)
        times = []
        for step in range(args["warmup"] + args["steps"]):
            batch = make_batch(step, args["groups"], args["min_len"], args["max_len"], args["prompt_len"])
            groups = rank_groups(batch, rank, world, 1)
            dist.barrier()
            t0 = time.perf_counter()
            backend.train_step(groups, step, ctx)
            dist.barrier()
            if step >= args["warmup"]:
                times.append(time.perf_counter() - t0)
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--pack-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=0, help="0: 4-11 tokens, drawn per group")
    p.add_argument("--processes", default="1,2")
    p.add_argument("--layouts", default="padded,packed,shared")
    p.add_argument("--precisions", default="fp32")
    ns = p.parse_args()
    args = vars(ns)
    from examples.addition.model import build_random_model

    layouts = ns.layouts.split(",")
    configs = [(w, lay, prec) for w in map(int, ns.processes.split(",")) for lay in layouts
               for prec in ns.precisions.split(",")]
    results: dict[tuple[int, str, str], list[float]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_random_model(model_dir, seed=0, hidden=ns.hidden, layers=ns.layers)
        params = sum(v.numel() for v in __import__("safetensors.torch", fromlist=["load_file"])
                     .load_file(str(model_dir / "model.safetensors")).values())
        print(f"model: llama hidden={ns.hidden} layers={ns.layers} ({params / 1e6:.2f}M params); batch: "
              f"{ns.groups}x{GROUP} samples of {ns.min_len}-{ns.max_len} tokens; {ns.steps} timed steps per config")
        for r in range(ns.rounds):
            for world, layout, prec in configs:
                out = Path(tmp) / f"t{r}-{world}-{layout}-{prec}.json"
                mp.spawn(_worker, args=(world, free_ports(1)[0], str(model_dir), layout, prec, args, str(out)),
                         nprocs=world, join=True)
                results[(world, layout, prec)].extend(json.loads(out.read_text()))
    base_key = configs[0]
    base = statistics.median(results[base_key])
    first = "vs " + " ".join(map(str, base_key))
    print(f"{'processes':>9} {'rows':>8} {'precision':>9} {'median step s':>14} {first:>20}")
    for key in configs:
        med = statistics.median(results[key])
        print(f"{key[0]:>9} {key[1]:>8} {key[2]:>9} {med:>14.3f} {base / med:>19.2f}x")


if __name__ == "__main__":
    main()
