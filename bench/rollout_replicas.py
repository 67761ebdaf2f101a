"""Rollout tokens/s with 1 vs 2 replicas: buffer + weight_sync + N rollout replica processes, no trainer.

The buffer is set so tickets never run out (no staleness gate, huge capacity); each replica claims groups, generates
and puts samples as in a run. Tokens/s = the replicas' generated tokens (Rollout.Status) over a window after warm-up.
Both settings run in this process's lifetime on the same machine, so the ratio is what to read. On a machine with
fewer free cores than replicas the ratio says more about the machine than about rlfleet.

Usage: python bench/rollout_replicas.py [--seconds 20] [--replicas 1 2] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.config import dump_config, load_config  # noqa: E402
from rlfleet.local.launcher import LocalRun, resolve, with_endpoints  # noqa: E402
from rlfleet.runtime.rpc import channel, read_token  # noqa: E402
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc  # noqa: E402

EXAMPLE = ROOT / "examples" / "addition" / "config.yaml"


def generated_tokens(endpoints: list[str], token: str | None) -> int:
    total = 0
    for e in endpoints:
        with channel(e, token) as ch:
            status = rollout_pb2_grpc.RolloutStub(ch).Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            total += status.generated_tokens
    return total


def measure(replicas: int, model: Path, work: Path, seconds: float, warmup: float) -> float:
    cfg = load_config(EXAMPLE, {
        "run.dir": str(work / f"r{replicas}"), "model.path": str(model), "model.prepare": None,
        "rollout.replicas": replicas, "rollout.group_size": 8, "rollout.claim_groups": 16,
        "rollout.max_batch_size": 128, "rollout.sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "buffer.max_staleness": 1_000_000, "buffer.capacity": 10_000_000, "buffer.fsync": "no",
        "trainer.steps": 1_000_000, "trainer.groups_per_step": 16})
    resolved = with_endpoints(resolve(cfg, fresh=True, resume=False))
    path = resolved.run_dir / "config.resolved.yaml"
    dump_config(resolved, path)
    local = LocalRun(resolved, path)
    token = read_token(resolved.security.token_file)
    threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        local._start("buffer", "rlfleet.services.buffer", [])
        local._start("weight_sync", "rlfleet.services.weight_sync", [])
        for i in range(replicas):
            local._start(f"rollout-{i}", "rlfleet.services.rollout", ["--replica-index", str(i)], threads)
        local._wait([resolved.endpoints.buffer, *resolved.endpoints.rollout], 300)
        time.sleep(warmup)
        t0, n0 = time.monotonic(), generated_tokens(resolved.endpoints.rollout, token)
        time.sleep(seconds)
        t1, n1 = time.monotonic(), generated_tokens(resolved.endpoints.rollout, token)
    finally:
        local.stop()
    return (n1 - n0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    ns = parser.parse_args()
    import os

    import torch

    from examples.addition.model import build_random_model

    torch.set_num_threads(1)
    print(f"cpu cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_random_model(model, seed=0, hidden=ns.hidden, layers=ns.layers)
        rates = {n: measure(n, model, Path(tmp), ns.seconds, ns.warmup) for n in ns.replicas}
    for n, rate in rates.items():
        print(f"{n} replica(s): {rate:,.0f} rollout tokens/s")
    if 1 in rates and len(rates) > 1:
        for n, rate in rates.items():
            if n != 1:
                print(f"{n} vs 1 replica: x{rate / rates[1]:.2f}")


if __name__ == "__main__":
    main()
