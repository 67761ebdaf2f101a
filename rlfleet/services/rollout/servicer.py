"""The rlfleet.v1.Rollout servicer: Generate (evaluation), Pause/Resume, LoadWeights, Status."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait

import grpc

from rlfleet.sample.packed_arrays import unpack_i32
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.engines.base import Engine, EngineError
from rlfleet.services.rollout.messages import generation_to_proto, sampling_from_proto
from rlfleet.services.rollout.throughput_log import ThroughputLog
from rlfleet.services.rollout.weight_updates import WeightUpdater, held_digest
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc, weights_pb2


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, replica_id: str, engine: Engine, updater: WeightUpdater, ctx: ServiceContext,
                 counters: ThroughputLog, in_flight_groups: Callable[[], int]) -> None:
        self._replica_id, self._engine, self._updater, self._ctx = replica_id, engine, updater, ctx
        self._counters = counters
        self._in_flight_groups = in_flight_groups
        self._initial_digest: str | None = None

    def Generate(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
                 ) -> rollout_pb2.GenerateReply:
        deadline = time.monotonic() + (context.time_remaining() or 3600.0)
        while self._engine.weight_version < request.min_version:
            if time.monotonic() >= deadline - 0.5:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"replica serves version {self._engine.weight_version} < min_version "
                              f"{request.min_version}")
            time.sleep(0.05)
        sampling = (sampling_from_proto(request.sampling, self._ctx.sampling) if request.HasField("sampling")
                    else self._ctx.sampling)
        try:
            futures = [self._engine.submit(unpack_i32(ids).tolist(), sampling) for ids in request.input_ids]
        except (EngineError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        wait(futures, timeout=max(deadline - time.monotonic(), 0.0))
        if not all(f.done() for f in futures):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "generation did not finish before the deadline")
        try:
            gens = [f.result() for f in futures]
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        return rollout_pb2.GenerateReply(generations=[generation_to_proto(g, request.return_logprobs) for g in gens])

    def Pause(self, request: rollout_pb2.PauseRequest, context: grpc.ServicerContext) -> rollout_pb2.PauseReply:
        in_flight = self._engine.pause()
        if request.mode == rollout_pb2.PAUSE_MODE_RETRACT:
            self._engine.abort_in_flight()
        return rollout_pb2.PauseReply(in_flight=in_flight)

    def Resume(self, request: rollout_pb2.ResumeRequest, context: grpc.ServicerContext) -> rollout_pb2.ResumeReply:
        self._engine.resume()
        return rollout_pb2.ResumeReply()

    def LoadWeights(self, request: weights_pb2.WeightManifest, context: grpc.ServicerContext
                    ) -> weights_pb2.UpdateResult:
        return self._updater.apply(request)

    def Status(self, request: rollout_pb2.RolloutStatusRequest, context: grpc.ServicerContext
               ) -> rollout_pb2.RolloutStatus:
        stats = self._engine.stats()
        digest = self._updater.digest
        if not digest:
            if self._initial_digest is None:
                self._initial_digest = held_digest(self._engine, [n for n, _ in self._engine.named_weights()])
            digest = self._initial_digest
        return rollout_pb2.RolloutStatus(
            replica_id=self._replica_id, weight_version=self._engine.weight_version,
            paused=self._engine.paused, generated_tokens=stats.generated_tokens,
            finished_samples=self._counters.finished_samples, in_flight_groups=self._in_flight_groups(),
            engine=self._engine.name, weights_digest=digest)
