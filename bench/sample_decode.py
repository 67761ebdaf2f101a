"""Per-sample CPU of the buffer's Put validation and framing and of the trainer's batch build, each against the
per-sample / per-row form it replaced, measured in the same run. Prints, never asserts.

  validate  rlfleet.sample.batch_check.first_invalid over a Put's samples vs validate_message on each sample
  put frame rlfleet.sample.put_wire.encode_put_request of serialized samples vs
  PutRequest(samples=...).SerializeToString()
  build     rlfleet.services.trainer.batch.build_train_batch (joined fields scattered at once) vs the per-row form
            (one torch.tensor per row and field: `per_row_build` below, the code it replaced)
Run: python bench/sample_decode.py [--samples 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.buffer_throughput import payload_sample  # noqa: E402
from rlfleet.sample import Sample, validate_message  # noqa: E402
from rlfleet.sample.batch_check import first_invalid  # noqa: E402
from rlfleet.sample.put_wire import encode_put_request  # noqa: E402
from rlfleet.services.trainer.batch import build_train_batch  # noqa: E402
from rlfleet.v1 import buffer_pb2  # noqa: E402


def per_row_build(samples: Sequence[Sample], pad_id: int = 0) -> tuple[torch.Tensor, ...]:
    """The per-row form: a tensor from Python lists for every row and field (what build_train_batch did)."""
    n = len(samples)
    seq_len = max((len(s.prompt_ids) + len(s.response_ids) for s in samples), default=0)
    resp_len = max((len(s.response_ids) for s in samples), default=0)
    input_ids = torch.full((n, seq_len), pad_id, dtype=torch.int64)                 # [S, L]
    attention_mask = torch.zeros((n, seq_len), dtype=torch.int64)                   # [S, L]
    response_mask = torch.zeros((n, resp_len), dtype=torch.float32)                 # [S, T]
    rollout_logprobs = torch.zeros((n, resp_len), dtype=torch.float32)              # [S, T]
    for row, s in enumerate(samples):
        p, t = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, :p + t] = torch.tensor(list(s.prompt_ids) + list(s.response_ids), dtype=torch.int64)
        attention_mask[row, :p + t] = 1
        if t:
            response_mask[row, :t] = torch.tensor(s.mask, dtype=torch.float32).clamp(0, 1)
            rollout_logprobs[row, :t] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    return input_ids, attention_mask, response_mask, rollout_logprobs


def per_sample_us(fn: Callable[[], object], samples: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):                 # best of: the machine is shared
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best / samples * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    a = parser.parse_args()
    print(f"us per sample, best of {a.repeats}; {a.samples} samples per call; torch threads {torch.get_num_threads()}")
    for size in (1024, 64 * 1024):
        for name, (t_new, t_old) in measure(size, a.samples, a.repeats).items():
            print(f"  {size // 1024:>2} KiB {name:<10} new {t_new:9.1f}   old {t_old:9.1f}   "
                  f"old/new {t_old / t_new:6.1f}x", flush=True)


def validate_each(msgs: list) -> None:
    for m in msgs:
        validate_message(m)


def measure(size: int, n: int, repeats: int) -> dict[str, tuple[float, float]]:
    """name -> (new, old) us per sample, for n samples of `size` bytes."""
    msgs = [payload_sample(f"g{i // 8}", i % 8, i // 8, size) for i in range(n)]
    raws = [m.SerializeToString() for m in msgs]
    samples = [Sample.from_proto(m) for m in msgs]
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "validate": (lambda: first_invalid(msgs), lambda: validate_each(msgs)),
        "put frame": (lambda: encode_put_request(raws, 5.0),
                      lambda: buffer_pb2.PutRequest(samples=msgs, wait_seconds=5.0).SerializeToString()),
        "build": (lambda: build_train_batch(samples), lambda: per_row_build(samples)),
    }
    return {name: (per_sample_us(new, n, repeats), per_sample_us(old, n, repeats))
            for name, (new, old) in pairs.items()}


if __name__ == "__main__":
    main()
