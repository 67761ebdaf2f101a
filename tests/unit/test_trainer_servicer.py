"""rlfleet.v1.Trainer over real gRPC: Status reports the loop's state; Checkpoint waits for the loop's next one."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from rlfleet.runtime.rpc import Server, channel
from rlfleet.services.trainer.servicer import TrainerServicer, TrainerState
from rlfleet.v1 import trainer_pb2, trainer_pb2_grpc


def test_status_and_checkpoint_rpcs() -> None:
    state = TrainerState(total_steps=10, world_size=2)
    server = Server("127.0.0.1:0", "tok", max_workers=4)
    server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(state), "rlfleet.v1.Trainer")
    server.start()
    try:
        stub = trainer_pb2_grpc.TrainerStub(channel(f"127.0.0.1:{server.port}", "tok"))
        state.update(step=3, weight_version=3, metrics={"loss": 0.5})
        status = stub.Status(trainer_pb2.TrainerStatusRequest(), timeout=5)
        assert (status.step, status.total_steps, status.weight_version, status.world_size) == (3, 10, 3, 2)
        assert status.metrics["loss"] == 0.5 and not status.finished

        def loop() -> None:                     # the training loop reaches a step boundary a bit later
            while not state.checkpoint_requested():
                time.sleep(0.01)
            state.checkpoint_taken(4, "/run/checkpoints/step_00000004")

        threading.Thread(target=loop, daemon=True).start()
        reply = stub.Checkpoint(trainer_pb2.CheckpointRequest(), timeout=10)
        assert (reply.step, reply.path) == (4, "/run/checkpoints/step_00000004")
        assert not state.checkpoint_requested()
        assert stub.Status(trainer_pb2.TrainerStatusRequest(), timeout=5).last_checkpoint.endswith("step_00000004")

        with pytest.raises(grpc.RpcError) as err:              # no step boundary before the deadline
            stub.Checkpoint(trainer_pb2.CheckpointRequest(), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        state.update(finished=True, step=10)
        reply = stub.Checkpoint(trainer_pb2.CheckpointRequest(), timeout=5)
        assert (reply.step, reply.path) == (9, "/run/checkpoints/step_00000004")
        bad = trainer_pb2_grpc.TrainerStub(channel(f"127.0.0.1:{server.port}", "wrong"))
        with pytest.raises(grpc.RpcError) as err:
            bad.Status(trainer_pb2.TrainerStatusRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)
