"""What true on-policy mode (trainer.on_policy) costs: the built-in engine's decode tokens/s and the trainer's
logprob forward, library kernels vs rlfleet/cpu_kernels/invariant_ops.py, on the same model, prompts and batch, in
one run.

    python bench/on_policy_cost.py [--prompts 64] [--new-tokens 8] [--hidden 128] [--layers 4] [--threads 1]

The addition example's model is hidden 128, 4 layers. Prints tokens/s of each engine, the trainer forward's
seconds, the ratios on-policy / baseline, and the largest |engine - trainer| logprob gap of each mode.
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
from rlfleet.cpu_kernels import invariant_call  # noqa: E402
from rlfleet.protocols import SamplingParams  # noqa: E402
from rlfleet.sample import Sample  # noqa: E402
from rlfleet.services.rollout.engines.torch_engine import TorchEngine  # noqa: E402
from rlfleet.services.trainer.batch import build_train_batch, forward_logprobs  # noqa: E402


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (n,), generator=g).tolist()
    return [[1, *torch.randint(4, vocab, (k,), generator=g).tolist()] for k in lengths]


def run(model: Path, prompts: list[list[int]], new_tokens: int, on_policy: bool) -> tuple[float, float, float]:
    """(engine tokens/s, trainer forward seconds, max |engine - trainer| logprob)."""
    engine = TorchEngine(model, max_batch_size=len(prompts), dtype="float32", eos_token_ids=(), on_policy=on_policy)
    try:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
        engine.submit(prompts[0], sampling).result()                       # warm-up
        start = time.perf_counter()
        outs = [f.result() for f in [engine.submit(p, SamplingParams(temperature=1.0, max_new_tokens=new_tokens,
                                                                     seed=i)) for i, p in enumerate(prompts)]]
        seconds = time.perf_counter() - start
        samples = [Sample(group_id="g", index=i, group_size=len(prompts), prompt_ids=p,
                          response_ids=list(o.output_ids), rollout_logprobs=list(o.logprobs))
                   for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
        batch = build_train_batch(samples)
        engine.model.train()
        with torch.no_grad():
            t0 = time.perf_counter()
            logp = invariant_call(forward_logprobs, engine.model, batch, 1.0) if on_policy else \
                forward_logprobs(engine.model, batch, 1.0)
            fwd = time.perf_counter() - t0
        valid = batch.response_mask > 0
        gap = float((logp[valid] - batch.rollout_logprobs[valid]).abs().max())
        return sum(len(o.output_ids) for o in outs) / seconds, fwd, gap
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        build_random_model(Path(tmp), seed=0, hidden=args.hidden, layers=args.layers)
        prompts = make_prompts(args.prompts, 19)
        base = run(Path(tmp), prompts, args.new_tokens, on_policy=False)
        onp = run(Path(tmp), prompts, args.new_tokens, on_policy=True)
    print(f"model hidden={args.hidden} layers={args.layers}; {args.prompts} prompts x {args.new_tokens} tokens, "
          f"threads={args.threads}")
    print(f"library kernels: engine {base[0]:8.1f} tok/s, trainer forward {base[1] * 1e3:7.1f} ms, "
          f"max |engine - trainer| logprob {base[2]:.3g}")
    print(f"on-policy:       engine {onp[0]:8.1f} tok/s, trainer forward {onp[1] * 1e3:7.1f} ms, "
          f"max |engine - trainer| logprob {onp[2]:.3g}")
    print(f"ratio on-policy / library: engine tokens/s x{onp[0] / base[0]:.3f}, trainer forward time "
          f"x{onp[1] / base[1]:.2f}")


if __name__ == "__main__":
    main()
