"""Peak memory of each FSDP rank while it loads the model: meta build + per-rank shard reads (the default) vs the
whole model loaded on every rank before sharding (what a LoRA run or an after_model_init hook still does).

    python bench/trainer_load_memory.py [--hidden 768 --layers 8 --vocab 32000] [--world 2]

Prints, per rank, the model's fp32 size, the peak RSS growth during FsdpBackend construction, and the ratio.
On CPU both stay near the shard: transformers maps the safetensors files, so the whole-model path touches only
the pages of the rows fully_shard keeps. The meta path matters on a GPU, where the old path moved the whole model
onto every rank's device before sharding.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlfleet.config import parse_config
from rlfleet.runtime.ports import free_ports


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(rank: int, world: int, port: int, model_dir: str, hooks: bool, out: str) -> None:
    torch.set_num_threads(1)
    from rlfleet.services.trainer.backends.fsdp import FsdpBackend, init_distributed

    cfg = parse_config({"model": {"path": model_dir}, "trainer": {"world_size": world, "groups_per_step": world},
                        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2}})
    device = torch.device("cpu")
    init_distributed(f"127.0.0.1:{port}", rank, world, device)
    before = _peak_mb()
    # A no-op after_model_init hook forces the whole-model path (the hook must see the unsharded model).
    backend = FsdpBackend(cfg, rank, world, device, hooks=[object()] if hooks else [])
    grew = _peak_mb() - before
    Path(out, f"r{rank}.json").write_text(json.dumps({"grew_mb": grew, "by_shards": backend.loaded_by_shards}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                          num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                          num_key_value_heads=a.hidden // 64, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        size_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
        model.save_pretrained(model_dir)
        del model
        results = {}
        for hooks in (False, True):
            out = Path(tmp) / f"out{hooks}"
            out.mkdir()
            mp.spawn(_worker, args=(a.world, free_ports(1)[0], str(model_dir), hooks, str(out)), nprocs=a.world)
            results[hooks] = [json.loads((out / f"r{r}.json").read_text()) for r in range(a.world)]
    print(f"model {size_mb:.0f} MB fp32, {a.world} ranks (shard = {size_mb / a.world:.0f} MB)")
    for r in range(a.world):
        shard, whole = results[False][r]["grew_mb"], results[True][r]["grew_mb"]
        print(f"rank {r}: peak RSS growth while loading: by shards {shard:.0f} MB, whole model {whole:.0f} MB "
              f"(ratio {shard / max(whole, 1e-9):.2f})")


if __name__ == "__main__":
    main()
