"""Over-sampling end to end on one replica: the real buffer gRPC service issues more groups than step 0 needs, the
trainer's GetBatch fills the step, the buffer cancels the groups still in flight, and the replica's work loop (the
real torch engine) aborts their requests: no engine slot or KV row stays held, and their samples never reach a batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from rlfleet.protocols import Generation, GroupTicket, Prompt, RolloutContext, RolloutFn, SamplingParams
from rlfleet.runtime.rpc import channel
from rlfleet.sample import Sample
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.messages import status_of
from rlfleet.services.rollout.work_loop import WorkLoop, WorkSettings
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc
from tests.support.engine_context import EngineContext
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
TOKEN = "cancel-token"
SIZE = 2
SHORT, LONG = 2, 20_000           # prompt 0 finishes at once; the others would run for minutes if not aborted




def rollout_fn(gens: list[Generation]) -> RolloutFn:
    def fn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        n = SHORT if prompt.index == 0 else LONG
        futures = [ctx.generate([1, 4 + i, 5], SamplingParams(max_new_tokens=n, seed=i, stop_token_ids=()))
                   for i in range(ticket.group_size)]
        for i, f in enumerate(futures):
            gen = f.result(timeout=600)
            gens.append(gen)
            yield Sample(group_id=ticket.group_id, index=i, group_size=ticket.group_size, prompt_ids=[1, 4 + i, 5],
                         response_ids=list(gen.output_ids), rollout_logprobs=list(gen.logprobs),
                         status=status_of(gen.finish_reason), weight_version=gen.weight_version,
                         prompt_index=ticket.prompt_index, reward=float(i))
    return fn


def wait_for(what: str, cond: Callable[[], object], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_cancelled_groups_free_their_engine_slots_and_kv(tmp_path: Path) -> None:
    settings = BufferSettings(capacity=64, group_size=SIZE, groups_per_step=1, steps=3, max_staleness=0,
                              over_sample=3.0, min_valid_per_group=1, lease_seconds=600.0)
    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="no"), settings)
    server = start_server(core, "127.0.0.1:0", TOKEN)
    engine = TorchEngine(make_tiny_model(tmp_path / "model"), max_batch_size=8, eos_token_ids=())
    stop, gens = threading.Event(), list[Generation]()
    prompts = {i: Prompt(index=i, token_ids=(1, 5)) for i in range(8)}
    # claim_wait 60: with both slots busy the loop long-polls Claim; only the buffer's wake-up can end it in time
    work_settings = WorkSettings(replica_id="r0", run_id="run", claim_groups=2, claim_wait=60.0)
    ch = channel(f"127.0.0.1:{server.port}", TOKEN)
    loop = WorkLoop(ch, engine, EngineContext(engine), prompts, rollout_fn(gens), work_settings, stop)
    result: list[bool] = []
    runner = threading.Thread(target=lambda: result.append(loop.run()), daemon=True)
    try:
        runner.start()
        # over_sample 3: g0, g1, g2 all feed step 0; g0 completes, g1 and g2 fill both slots of the replica
        wait_for("step 0's three groups", lambda: core.stats().next_prompt_index == 3 and core.stats().ready_groups)
        wait_for("long requests in the engine", lambda: engine.stats().running == 2 * SIZE and engine.kv_tokens())
        assert loop.in_flight_groups == 2
        stub = buffer_pb2_grpc.BufferStub(ch)
        batch = stub.GetBatch(buffer_pb2.GetBatchRequest(step=0, num_groups=1, policy_version=0, wait_seconds=5),
                              timeout=30)
        assert batch.complete and list(batch.group_ids) == ["g0"]
        # g1, g2 were claimed under version 0 and step 1 needs version 1: cancelled, the replica aborts them
        wait_for("the engine to drop the cancelled requests",
                 lambda: engine.stats().running == 0 and engine.stats().waiting == 0 and engine.kv_tokens() == 0,
                 seconds=20)
        wait_for("the aborted samples to be refused", lambda: dict(core.stats().dropped).get("aborted") == 2 * SIZE)
        stats = stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
        assert stats.cancelled_groups == 2 and stats.tickets_in_flight == 0 and stats.stored_samples == 0
        assert stats.next_prompt_index == 3                            # no new work before version 1 exists
        aborted = [g for g in gens if g.finish_reason == "abort"]
        assert len(aborted) == 2 * SIZE and all(len(g.output_ids) < LONG for g in aborted)
        wait_for("the group threads to end", lambda: loop.in_flight_groups == 0, seconds=10)
    finally:
        stop.set()
        runner.join(30)
        loop.close()
        engine.shutdown()
        ch.close()
        server.stop(0)
        core.close()
    assert result == [False] and not runner.is_alive()                # stopped by us, not by a finished run
