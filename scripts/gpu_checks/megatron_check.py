"""GPU check for the device machine: one trainer step (old-logprob forward, forward/backward, AdamW) of the
Megatron-core backend on a Qwen2-0.5B-shaped model in bf16 on one CUDA device, then the same step with the FSDP2
backend; prints tokens/s and model FLOPs utilisation (MFU) of each as JSON lines.

    python scripts/gpu_checks/megatron_check.py                        # Qwen2-0.5B shape, B=8 x 2048, on cuda
    python scripts/gpu_checks/megatron_check.py --tiny --device cpu    # CPU-sized dry run; on CPU megatron needs
                                                                       # the test shims (test_megatron_gpu_check.py)
Needs megatron-core (0.19 on the device machine's Python 3.12) and a CUDA torch. A random model is written to --workdir.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                     # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from rlfleet.config import Config, parse_config  # noqa: E402
from rlfleet.sample import Sample  # noqa: E402
from rlfleet.services.trainer.algorithms import resolve  # noqa: E402
from rlfleet.services.trainer.backends import make_backend  # noqa: E402
from rlfleet.services.trainer.backends.fsdp import init_distributed  # noqa: E402
from rlfleet.services.trainer.step import StepContext  # noqa: E402

H200_BF16_PEAK = 989e12          # dense bf16 FLOP/s of one H200 (SXM)

# Qwen2-0.5B: 24 layers, hidden 896, 14 heads / 2 kv heads (head_dim 64), ffn 4864, vocab 151936, tied embeddings
QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 4096,
             "tie_word_embeddings": True}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64, "tie_word_embeddings": True}


def write_model(path: Path, shape: dict[str, int | bool], seed: int = 0) -> Path:
    """A random Qwen2 of `shape` saved as an HF folder (bf16 safetensors)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.to(torch.bfloat16).save_pretrained(str(path), safe_serialization=True)
    return path


def model_flops_per_token(shape: dict[str, Any], seq: int) -> float:
    """Forward FLOPs per token: 2 * matmul parameters (embedding lookup excluded, LM head included) + causal
    attention (QK^T and AV over seq/2 keys on average)."""
    h, f, n = int(shape["hidden_size"]), int(shape["intermediate_size"]), int(shape["num_hidden_layers"])
    d = h // int(shape["num_attention_heads"])
    q, kv = int(shape["num_attention_heads"]) * d, int(shape["num_key_value_heads"]) * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * f
    matmul = n * per_layer + h * int(shape["vocab_size"])
    attention = n * 2 * q * seq                     # 2 matmuls * 2 FLOPs * q * (seq / 2)
    return 2.0 * matmul + attention


def step_flops(shape: dict[str, Any], seq: int, tokens: int) -> float:
    """A trainer step: a no-grad forward for old logprobs (1x), then forward + backward (3x)."""
    return 4.0 * model_flops_per_token(shape, seq) * tokens


def run_config(workdir: Path, model_dir: Path, backend: str, device: str, groups: int, microbatches: int) -> Config:
    return parse_config({
        "run": {"dir": str(workdir / f"run-{backend}")}, "model": {"path": str(model_dir), "dtype": "bfloat16"},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2, "sampling": {"temperature": 1.0}},
        "trainer": {"backend": backend, "world_size": 1, "groups_per_step": groups, "minibatches": 1, "lr": 1e-6,
                    "device": device, "megatron": {"microbatches": microbatches}},
    })


def synthetic_groups(groups: int, seq: int, vocab: int, seed: int) -> list[list[Sample]]:
    """`groups` groups of 2 samples of `seq` tokens: half prompt, half response."""
    g = torch.Generator().manual_seed(seed)
    prompt, response = seq // 2, seq - seq // 2
    out = []
    for gi in range(groups):
        group = []
        for i in range(2):
            ids = torch.randint(3, vocab, (seq,), generator=g).tolist()
            group.append(Sample(group_id=f"g{gi}", index=i, group_size=2, prompt_ids=ids[:prompt],
                                response_ids=ids[prompt:], rollout_logprobs=[-2.0] * response, loss_mask=[1] * response,
                                reward=float(i)))
        out.append(group)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(backend_name: str, cfg: Config, shape: dict[str, Any], seq: int, steps: int, warmup: int) -> dict[str, Any]:
    """Build the backend, run warmup + steps trainer steps on synthetic groups; tokens/s and MFU of the timed ones."""
    device = torch.device(cfg.trainer.device if cfg.trainer.device != "cuda" else "cuda:0")
    backend = make_backend(cfg, 0, 1, device)
    advantage_fn, loss_fn = resolve(cfg.trainer)
    ctx = StepContext(advantage_fn, loss_fn, (), temperature=1.0, minibatches=1, grad_clip=1.0, world_size=1,
                      device=device, pad_id=backend.pad_id)
    groups = synthetic_groups(cfg.trainer.groups_per_step, seq, int(shape["vocab_size"]), seed=0)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for g in groups for s in g)
    metrics: dict[str, float] = {}
    for step in range(warmup):
        metrics = backend.train_step(groups, step, ctx)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for step in range(warmup, warmup + steps):
        metrics = backend.train_step(groups, step, ctx)
    _sync(device)
    seconds = (time.perf_counter() - start) / max(steps, 1)
    flops = step_flops(shape, seq, tokens)
    result = {"backend": backend_name, "device": str(device), "tokens_per_step": tokens, "step_seconds": seconds,
              "tokens_per_s": tokens / seconds, "tflops_per_s": flops / seconds / 1e12,
              "mfu": flops / seconds / H200_BF16_PEAK, "loss": metrics.get("loss"),
              "grad_norm": metrics.get("grad_norm"),
              "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    del backend
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a CPU-sized model (dry run)")
    parser.add_argument("--groups", type=int, default=4, help="groups of 2 samples per step (4: B=8)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=2, help="megatron schedule microbatches per step")
    parser.add_argument("--backends", default="megatron,fsdp")
    parser.add_argument("--workdir", default="")
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else QWEN2_05B
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="megatron_check-"))
    model_dir = write_model(workdir / ("tiny" if args.tiny else "qwen2-0.5b"), shape)
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    init_distributed("", 0, 1, torch.device(args.device if args.device != "cuda" else "cuda:0"))
    results = []
    for name in args.backends.split(","):
        cfg = run_config(workdir, model_dir, name, args.device, args.groups, args.microbatches)
        result = measure(name, cfg, shape, args.seq, args.steps, args.warmup)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
