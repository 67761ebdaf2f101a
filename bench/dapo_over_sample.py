"""Wall time per trainer step with DAPO's dynamic sampling dropping about half the groups: buffer.over_sample 1.0
(a replacement ticket only after a group is dropped) vs 2.0 (twice the need issued up front, the rest cancelled).

Synchronous RL (max_staleness 0) on one replica: the real buffer (embedded store, gRPC), the work loop and the torch
engine on a tiny random model; the "trainer" takes each batch, acks it and loads the next weight version (the same
tensors under a new version number), so the step time is rollout + buffer + weight load. Both runs happen in this
process, so the ratio is what to read.
Usage: python bench/dapo_over_sample.py [--steps 12] [--groups-per-step 4]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, RolloutFn, SamplingParams  # noqa: E402
from rlfleet.runtime.rpc import channel  # noqa: E402
from rlfleet.sample import Sample  # noqa: E402
from rlfleet.services.buffer.core import BufferCore  # noqa: E402
from rlfleet.services.buffer.filters import load_filters  # noqa: E402
from rlfleet.services.buffer.server import start_server  # noqa: E402
from rlfleet.services.buffer.settings import BufferSettings  # noqa: E402
from rlfleet.services.buffer.stores.embedded import EmbeddedStore  # noqa: E402
from rlfleet.services.rollout.engines.torch_engine import TorchEngine  # noqa: E402
from rlfleet.services.rollout.messages import status_of  # noqa: E402
from rlfleet.services.rollout.work_loop import WorkLoop, WorkSettings  # noqa: E402
from tests.support.engine_context import EngineContext  # noqa: E402
from tests.support.tiny_model import make_tiny_model  # noqa: E402

TOKEN = "bench"




def make_rollout_fn(tokens: int) -> RolloutFn:
    def fn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        flat = random.Random(prompt.index).random() < 0.5            # about half the groups: all rewards equal
        ids = [1, 4 + prompt.index % 10, 5]
        futures = [ctx.generate(ids, SamplingParams(max_new_tokens=tokens, seed=i, stop_token_ids=()))
                   for i in range(ticket.group_size)]
        for i, f in enumerate(futures):
            gen = f.result()
            yield Sample(group_id=ticket.group_id, index=i, group_size=ticket.group_size, prompt_ids=ids,
                         response_ids=list(gen.output_ids), rollout_logprobs=list(gen.logprobs),
                         status=status_of(gen.finish_reason), weight_version=gen.weight_version,
                         prompt_index=ticket.prompt_index, reward=0.0 if flat else float(i))
    return fn


def run(tmp: Path, model: Path, over_sample: float, steps: int, gps: int, size: int, tokens: int) -> list[float]:
    """Seconds of each step after the first (start-up excluded)."""
    settings = BufferSettings(capacity=4096, group_size=size, groups_per_step=gps, steps=steps, max_staleness=0,
                              over_sample=over_sample, min_valid_per_group=1, lease_seconds=600.0)
    core = BufferCore(EmbeddedStore(tmp / f"buffer-{over_sample}", fsync="no"), settings,
                      load_filters(["dynamic_sampling"]))
    server = start_server(core, "127.0.0.1:0", TOKEN)
    engine = TorchEngine(model, max_batch_size=64, eos_token_ids=())
    stop = threading.Event()
    ch = channel(f"127.0.0.1:{server.port}", TOKEN)
    prompts = {i: Prompt(index=i, token_ids=(1, 5)) for i in range(100_000)}
    loop = WorkLoop(ch, engine, EngineContext(engine, "bench"), prompts, make_rollout_fn(tokens),
                    WorkSettings(replica_id="bench", run_id="bench", claim_groups=4 * gps, claim_wait=2.0), stop)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    ends = []
    try:
        weights = [(n, t.clone()) for n, t in engine.named_weights()]
        for step in range(steps):
            batch = core.get_batch(step, gps, step, wait=120)
            assert batch.complete, f"step {step}: no batch"
            core.ack(step)
            engine.update_weights_from_tensor(weights, version=step + 1)     # the trainer's next version
            ends.append(time.monotonic())
        dropped = dict(core.stats().dropped)
        print(f"over_sample={over_sample}: {core.stats().next_prompt_index} groups issued for {steps * gps} used; "
              f"dropped samples {dropped}; cancelled groups {core.stats().cancelled_groups}")
    finally:
        stop.set()
        runner.join(30)
        loop.close()
        engine.shutdown()
        ch.close()
        server.stop(0)
        core.close()
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        per_step = {}
        for over_sample in (1.0, 2.0):
            times = run(Path(tmp), model, over_sample, ns.steps, ns.groups_per_step, ns.group_size, ns.tokens)
            per_step[over_sample] = sum(times) / len(times)
            print(f"over_sample={over_sample}: {per_step[over_sample] * 1000:.0f} ms per step")
        print(f"step time ratio over_sample 1.0 / 2.0: {per_step[1.0] / per_step[2.0]:.2f}")


if __name__ == "__main__":
    main()
