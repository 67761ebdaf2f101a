"""Decode throughput of the built-in torch engine vs HF `generate` on the same model and batch, in one run.

    python bench/engine_decode.py [--prompts 64] [--new-tokens 64] [--hidden 256] [--layers 4] [--threads 1]
                                  [--compile] [--model-dir DIR] [--device cuda --dtype bfloat16]
                                  [--baseline NAME=DIR ...]

Engines measured in the same run, interleaved: the torch engine with its lean Llama prefill and decode step
(engines/lean_llama/: fast_prefill.py, fast_decode.py), the same engine through the HF modules (fast_decode=False),
optionally with torch.compile (--compile), and HF `generate`; --baseline adds the engine of another source tree
(e.g. made with `git worktree add /tmp/base REV`), so a change is measured against its revision in the same run.
--model-dir measures a real model folder (e.g. SmolLM2-135M as safetensors) instead of a random llama of --hidden x
--layers (the addition example's model is --hidden 128 --layers 4).

Each contender runs in a process of its own (started once, then told to run one round at a time, in turn): with more
than one torch thread, two long-lived threads that both ran OpenMP work in one process throttle each other's
thread wake-ups (see rlfleet/services/rollout/engines/torch_engine.py), which would slow whichever side ran second.

Both sides sample (temperature 1) every prompt to exactly --new-tokens tokens (the engine ignores EOS; HF gets
min_new_tokens), so they do the same amount of work. Prints tokens/s of each and the ratio engine / HF.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine

CONTENDERS = {"torch engine (fast decode)": "fast", "torch engine (HF modules)": "modules",
              "torch engine (fast, compiled)": "compiled", "HF generate": "hf"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (n,), generator=g).tolist()
    return [[1, *torch.randint(4, vocab, (k,), generator=g).tolist()] for k in lengths]


def run_engine(engine: TorchEngine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) to generate new_tokens for every prompt."""
    from rlfleet.protocols import SamplingParams

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
    device = next(model.parameters()).device
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=pad)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] == length + new_tokens
    return seconds, cpu


def worker(kind: str, args: argparse.Namespace) -> None:
    """One contender: load, warm up, say "ready", then one measured round per "go" line on stdin. --root: the engine
    comes from that source tree (another revision, measured in the same run)."""
    if args.root:
        sys.path.insert(0, args.root)
    from rlfleet.services.rollout.engines.torch_engine import TorchEngine

    torch.set_num_threads(args.threads)
    dtype = DTYPES.get(args.dtype or "", torch.float32)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model_dir).vocab_size
    prompts = make_prompts(args.prompts, min(vocab, 1000))
    if kind == "hf":
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype).to(args.device).eval()
        pad = hf.config.pad_token_id or 0
        run_hf(hf, prompts[:4], 4, pad)

        def measure() -> tuple[float, float]:
            return run_hf(hf, prompts, args.new_tokens, pad)
    else:
        engine = TorchEngine(args.model_dir, max_batch_size=args.prompts, device=args.device, dtype=args.dtype,
                             eos_token_ids=(), fast_decode=kind != "modules", compile=kind == "compiled")
        run_engine(engine, prompts, 4)                                           # warm-up (and compile)

        def measure() -> tuple[float, float]:
            return run_engine(engine, prompts, args.new_tokens)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        seconds, cpu = measure()
        print(f"{seconds} {cpu}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=list(DTYPES))
    ap.add_argument("--compile", action="store_true", help="also measure the engine with torch.compile")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR",
                    help="also measure the fast-decode engine of the source tree DIR (e.g. a git worktree of an "
                         "earlier revision), printed as NAME")
    ap.add_argument("--worker", choices=list(CONTENDERS.values()), help=argparse.SUPPRESS)
    ap.add_argument("--root", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir:
            label = Path(args.model_dir).name
        else:
            from examples.addition.model import build_random_model

            hf = build_random_model(Path(tmp), hidden=args.hidden, layers=args.layers)
            hf.config.max_position_embeddings = 256                                # room for prompt + new tokens
            hf.save_pretrained(tmp, safe_serialization=True)
            args.model_dir, label = tmp, f"llama hidden={args.hidden} layers={args.layers}"
        names = [n for n, k in CONTENDERS.items() if k != "compiled" or args.compile]
        passed = [f"--prompts={args.prompts}", f"--new-tokens={args.new_tokens}", f"--threads={args.threads}",
                  f"--device={args.device}", f"--model-dir={args.model_dir}",
                  *([f"--dtype={args.dtype}"] if args.dtype else [])]
        workers = {name: [CONTENDERS[name]] for name in names}
        for spec in args.baseline:
            label_b, _, root = spec.partition("=")
            workers[f"{label_b} (fast decode)"] = ["fast", f"--root={Path(root).resolve()}"]
        procs = {name: subprocess.Popen([sys.executable, __file__, *passed, "--worker", *how],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for name, how in workers.items()}
        try:
            for name, proc in procs.items():                                     # loaded and warmed up, one at a time
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit(f"{name}: worker failed to start")
            seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
            for _ in range(args.repeats):                                        # interleaved: same machine load
                for name, proc in procs.items():
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                    wall, cpu_s = proc.stdout.readline().split()
                    seconds[name].append((float(wall), float(cpu_s)))
        finally:
            for proc in procs.values():
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=60)
    tokens = args.prompts * args.new_tokens
    best = {name: min(w for w, _ in s) for name, s in seconds.items()}
    cpu = {name: min(c for _, c in s) for name, s in seconds.items()}     # CPU seconds: steadier on a shared box
    print(f"model: {label} device={args.device} dtype={args.dtype or 'float32'} threads={args.threads}; "
          f"batch {args.prompts} prompts x {args.new_tokens} new tokens (best of {args.repeats}, each contender in "
          f"its own process; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    for name, s in best.items():
        print(f"{name:30s}: {tokens / s:10.1f} tokens/s wall ({s:.3f} s), ratio to HF {best['HF generate'] / s:.2f}x"
              f" | {tokens / cpu[name]:10.1f} tokens per CPU-s, ratio to HF {cpu['HF generate'] / cpu[name]:.2f}x")


if __name__ == "__main__":
    main()
