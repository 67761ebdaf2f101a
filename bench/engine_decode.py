"""Decode throughput of the built-in torch engine vs HF `generate` on the same model and batch, in one run.

    python bench/engine_decode.py [--prompts 64] [--new-tokens 64] [--hidden 256] [--layers 4] [--threads 1]
                                  [--compile] [--model-dir DIR] [--device cuda --dtype bfloat16]

Engines measured in the same run, interleaved: the torch engine with its lean Llama decode step (fast_decode.py),
the same engine through the HF modules (fast_decode=False: the before), optionally with torch.compile (--compile),
and HF `generate`. --model-dir measures a real model folder (e.g. SmolLM2-135M as safetensors) instead of a random
llama of --hidden x --layers (the addition example's model is --hidden 128 --layers 4).

Both sides sample (temperature 1) every prompt to exactly --new-tokens tokens (the engine ignores EOS; HF gets
min_new_tokens), so they do the same amount of work. Prints tokens/s of each and the ratio engine / HF.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.addition.model import build_random_model  # noqa: E402
from rlfleet.protocols import SamplingParams  # noqa: E402
from rlfleet.services.rollout.engines.torch_engine import TorchEngine  # noqa: E402


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (n,), generator=g).tolist()
    return [[1, *torch.randint(4, vocab, (k,), generator=g).tolist()] for k in lengths]


def run_engine(engine: TorchEngine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) to generate new_tokens for every prompt."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    start, cpu = time.perf_counter(), time.process_time()
    futures = [engine.submit(p, sampling) for p in prompts]
    outs = [f.result() for f in futures]
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(len(o.output_ids) == new_tokens for o in outs)
    return seconds, cpu


def run_hf(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, pad: int) -> tuple[float, float]:
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad, dtype=torch.long)           # [B, P] left-padded
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, length - len(p):] = torch.tensor(p)
        mask[i, length - len(p):] = 1
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] == length + new_tokens
    return seconds, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", action="store_true", help="also measure the engine with torch.compile")
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.dtype or "",
                                                                                              torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir:
            from transformers import AutoModelForCausalLM

            folder, label = args.model_dir, Path(args.model_dir).name
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        else:
            hf = build_random_model(Path(tmp), hidden=args.hidden, layers=args.layers)
            hf.config.max_position_embeddings = 256                                # room for prompt + new tokens
            hf.save_pretrained(tmp, safe_serialization=True)
            folder, label = tmp, f"llama hidden={args.hidden} layers={args.layers}"
        hf = hf.to(args.device, dtype).eval()
        params = sum(p.numel() for p in hf.parameters())
        engines = {"torch engine (fast decode)": TorchEngine(folder, max_batch_size=args.prompts, device=args.device,
                                                             dtype=args.dtype, eos_token_ids=()),
                   "torch engine (HF modules)": TorchEngine(folder, max_batch_size=args.prompts, device=args.device,
                                                            dtype=args.dtype, eos_token_ids=(), fast_decode=False)}
        if args.compile:
            engines["torch engine (fast, compiled)"] = TorchEngine(folder, max_batch_size=args.prompts,
                                                                   device=args.device, dtype=args.dtype,
                                                                   eos_token_ids=(), compile=True)
    prompts = make_prompts(args.prompts, min(hf.config.vocab_size, 1000))
    tokens = args.prompts * args.new_tokens
    for engine in engines.values():                                              # warm-up (and compile)
        run_engine(engine, prompts, 4)
    run_hf(hf, prompts[:4], 4, hf.config.pad_token_id or 0)
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in [*engines, "HF generate"]}
    for _ in range(args.repeats):                                                # interleaved: same machine load
        for name, engine in engines.items():
            seconds[name].append(run_engine(engine, prompts, args.new_tokens))
        seconds["HF generate"].append(run_hf(hf, prompts, args.new_tokens, hf.config.pad_token_id or 0))
    for engine in engines.values():
        engine.shutdown()
    best = {name: min(w for w, _ in s) for name, s in seconds.items()}
    cpu = {name: min(c for _, c in s) for name, s in seconds.items()}     # CPU seconds: steadier on a shared box
    print(f"model: {label} params={params / 1e6:.2f}M device={args.device} dtype={dtype} threads={args.threads}; "
          f"batch {args.prompts} prompts x {args.new_tokens} new tokens (best of {args.repeats}; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for name, s in best.items():
        print(f"{name:30s}: {tokens / s:10.1f} tokens/s wall ({s:.3f} s), ratio to HF {best['HF generate'] / s:.2f}x"
              f" | {tokens / cpu[name]:10.1f} tokens per CPU-s, ratio to HF {cpu['HF generate'] / cpu[name]:.2f}x")


if __name__ == "__main__":
    main()
