"""Trainer progress from the live run: Trainer.Status (rank 0), Buffer.Stats, and each rank's /metrics."""

from __future__ import annotations

import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

from rlfleet.config import Config
from rlfleet.runtime.rpc import channel
from rlfleet.security.identity import Credential
from rlfleet.services.controller.progress import TrainerProgress
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, trainer_pb2, trainer_pb2_grpc

LAST_STEP = "rlfleet_trainer_last_step_timestamp_seconds"


def rank_last_step(ip: str | None, port: int = 9400, timeout: float = 3.0) -> float | None:
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=timeout) as resp:  # noqa: S310
            text = resp.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LAST_STEP and sample.value > 0:
                return float(sample.value)
    return None


class GrpcProgress:
    def __init__(self, cfg: Config, token: Credential, timeout: float = 5.0) -> None:
        self.cfg = cfg
        self.token = token
        self.timeout = timeout

    def buffer_stats(self) -> buffer_pb2.BufferStats | None:
        try:
            with channel(self.cfg.endpoints.buffer, self.token) as ch:
                return buffer_pb2_grpc.BufferStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=self.timeout)
        except grpc.RpcError:
            return None

    def tickets_in_flight(self) -> int | None:
        stats = self.buffer_stats()
        return None if stats is None else int(stats.tickets_in_flight)

    def read(self, trainer_pods: list[tuple[str, str | None]]) -> TrainerProgress:
        status = None
        try:
            with channel(self.cfg.endpoints.trainer, self.token) as ch:
                status = trainer_pb2_grpc.TrainerStub(ch).Status(trainer_pb2.TrainerStatusRequest(),
                                                                 timeout=self.timeout)
        except grpc.RpcError:
            pass
        stats = self.buffer_stats()
        return TrainerProgress(
            step=None if status is None else int(status.step),
            ready_groups=None if stats is None else int(stats.ready_groups),
            groups_per_step=self.cfg.trainer.groups_per_step,
            finished=bool(status is not None and status.finished) or bool(stats is not None and stats.finished),
            rank_last_step={name: rank_last_step(ip) for name, ip in trainer_pods})
