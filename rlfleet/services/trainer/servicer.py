"""rlfleet.v1.Trainer on rank 0: Status, and Checkpoint (taken by the training loop at the next step boundary)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

import grpc

from rlfleet.v1 import trainer_pb2, trainer_pb2_grpc

CHECKPOINT_WAIT = 600.0


@dataclass
class TrainerState:
    """What Status reports; written by the training loop, read by the servicer."""

    total_steps: int
    world_size: int
    step: int = 0                       # steps done (committed or not)
    weight_version: int = 0
    last_checkpoint: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    _requests: list[Future[tuple[int, str]]] = field(default_factory=list)

    def update(self, **values: object) -> None:
        with self.lock:
            for k, v in values.items():
                setattr(self, k, v)

    def request_checkpoint(self) -> Future[tuple[int, str]]:
        fut: Future[tuple[int, str]] = Future()
        with self.lock:
            if self.finished:
                fut.set_result((max(self.step - 1, 0), self.last_checkpoint))
            else:
                self._requests.append(fut)
        return fut

    def checkpoint_requested(self) -> bool:
        with self.lock:
            return bool(self._requests)

    def checkpoint_taken(self, step: int, path: str) -> None:
        with self.lock:
            self.last_checkpoint = path
            pending, self._requests = self._requests, []
        for fut in pending:
            fut.set_result((step, path))


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, state: TrainerState) -> None:
        self.state = state

    def Status(self, request: trainer_pb2.TrainerStatusRequest, context: grpc.ServicerContext
               ) -> trainer_pb2.TrainerStatus:
        s = self.state
        with s.lock:
            return trainer_pb2.TrainerStatus(step=s.step, total_steps=s.total_steps, weight_version=s.weight_version,
                                             last_checkpoint=s.last_checkpoint, metrics=dict(s.metrics),
                                             finished=s.finished, world_size=s.world_size)

    def Checkpoint(self, request: trainer_pb2.CheckpointRequest, context: grpc.ServicerContext
                   ) -> trainer_pb2.CheckpointReply:
        fut = self.state.request_checkpoint()
        remaining = context.time_remaining()
        try:
            step, path = fut.result(timeout=min(CHECKPOINT_WAIT, remaining) if remaining else CHECKPOINT_WAIT)
        except TimeoutError:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the trainer reached no step boundary in time")
        return trainer_pb2.CheckpointReply(step=step, path=path)
