"""Wire the weight-sync control plane together from a config: version board, servicer, metrics, gRPC server (SPEC,
run by rlfleet.runtime.service_skeleton.run_service). Serves rlfleet.v1.WeightSync until SIGTERM/SIGINT, then exits
0."""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry

from rlfleet.runtime.exit_codes import FAILED
from rlfleet.runtime.metrics import JsonlLog, WeightSyncMetrics, serve_metrics
from rlfleet.runtime.rpc import Server
from rlfleet.runtime.service_main import ServiceArgs, serve_until
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec, StartError, bind_address
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.v1 import weight_sync_pb2_grpc

log = logging.getLogger("weight_sync")


class WeightSyncServer:
    """The running weight-sync service (a rlfleet.runtime.service_skeleton.Service)."""

    def __init__(self, args: ServiceArgs) -> None:
        cfg = args.config
        bind = bind_address("endpoints.weight_sync", cfg.endpoints.weight_sync, args.listen)
        registry = CollectorRegistry()
        metrics = WeightSyncMetrics(registry)
        self.jsonl = JsonlLog(cfg.run_dir / "metrics" / "weight_sync.jsonl")
        self.board = VersionBoard()
        self.stop = threading.Event()
        # each Subscribe stream holds a worker thread for its lifetime: room for every replica twice, plus unary calls
        try:
            self.server = Server(bind, args.token, max_workers=64 + 2 * cfg.rollout.replicas)
        except (OSError, RuntimeError) as exc:
            raise StartError(f"cannot serve on {bind}: {exc}", FAILED) from None
        self.server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                        WeightSyncServicer(self.board, metrics, self.jsonl), "rlfleet.v1.WeightSync")
        self.server.start()
        serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
        log.info("serving rlfleet.v1.WeightSync on %s (port %d)", bind, self.server.port)

    def serve(self) -> Outcome:
        serve_until(self.stop)
        return Outcome()

    def signalled(self, signum: int) -> None:
        self.stop.set()

    def close(self) -> None:
        log.info("stopping")
        self.board.close()
        self.server.stop(grace=1.0)
        self.jsonl.close()


SPEC = ServiceSpec(name="weight_sync", start=WeightSyncServer)
