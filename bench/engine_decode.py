"""Decode throughput of the built-in torch engine vs HF `generate` on the same model and batch, in one run.

    python bench/engine_decode.py [--prompts 32] [--new-tokens 64] [--hidden 256] [--layers 4] [--threads 1]

Both sides sample (temperature 1) every prompt to exactly --new-tokens tokens (the engine ignores EOS; HF gets
min_new_tokens), so they do the same amount of work. Prints tokens/s of each and the ratio engine / HF.
"""

from __future__ import annotations

import argparse
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
from services.rollout.engines.torch_engine import TorchEngine  # noqa: E402


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (n,), generator=g).tolist()
    return [[1, *torch.randint(4, vocab, (k,), generator=g).tolist()] for k in lengths]


def run_engine(engine: TorchEngine, prompts: list[list[int]], new_tokens: int) -> float:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    start = time.perf_counter()
    futures = [engine.submit(p, sampling) for p in prompts]
    outs = [f.result() for f in futures]
    seconds = time.perf_counter() - start
    assert all(len(o.output_ids) == new_tokens for o in outs)
    return seconds


def run_hf(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, pad: int) -> float:
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad, dtype=torch.long)           # [B, P] left-padded
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, length - len(p):] = torch.tensor(p)
        mask[i, length - len(p):] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)
    seconds = time.perf_counter() - start
    assert out.shape[1] == length + new_tokens
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_random_model(Path(tmp), hidden=args.hidden, layers=args.layers)
        hf.config.max_position_embeddings = 256                                    # room for prompt + new tokens
        hf.save_pretrained(tmp, safe_serialization=True)
        hf = hf.to(args.device).eval()
        params = sum(p.numel() for p in hf.parameters())
        engine = TorchEngine(tmp, max_batch_size=args.prompts, device=args.device, eos_token_ids=())
    prompts = make_prompts(args.prompts, hf.config.vocab_size)
    tokens = args.prompts * args.new_tokens
    run_engine(engine, prompts[:4], 4)                                           # warm-up
    run_hf(hf, prompts[:4], 4, hf.config.pad_token_id)
    eng_s, hf_s = [], []
    for _ in range(args.repeats):                                                # interleaved: same machine load
        eng_s.append(run_engine(engine, prompts, args.new_tokens))
        hf_s.append(run_hf(hf, prompts, args.new_tokens, hf.config.pad_token_id))
    engine.shutdown()
    eng_best, hf_best = min(eng_s), min(hf_s)
    print(f"model: llama hidden={args.hidden} layers={args.layers} params={params / 1e6:.2f}M device={args.device} "
          f"threads={args.threads}; batch {args.prompts} prompts x {args.new_tokens} new tokens (best of "
          f"{args.repeats})")
    print(f"torch engine : {tokens / eng_best:10.1f} tokens/s  ({eng_best:.3f} s)")
    print(f"HF generate  : {tokens / hf_best:10.1f} tokens/s  ({hf_best:.3f} s)")
    print(f"ratio engine / HF generate: {hf_best / eng_best:.2f}x")


if __name__ == "__main__":
    main()
