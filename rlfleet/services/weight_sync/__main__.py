"""python -m rlfleet.services.weight_sync --config RUN_DIR/config.resolved.yaml [--listen HOST:PORT] [--metrics-port P]

Serves rlfleet.v1.WeightSync until SIGTERM/SIGINT, then exits 0.
"""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry

from rlfleet.config import ConfigError
from rlfleet.metrics import JsonlLog, WeightSyncMetrics, serve_metrics
from rlfleet.rpc import Server
from rlfleet.service_main import listen_address, parse_service_args, serve_until, stop_on_signals
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.v1 import weight_sync_pb2_grpc

log = logging.getLogger("weight_sync")


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args("weight_sync", argv)
    cfg = args.config
    try:
        bind = listen_address(cfg.endpoints.weight_sync, args.listen)
    except ConfigError as exc:
        print(f"weight_sync: {exc} (set endpoints.weight_sync or --listen)", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    metrics = WeightSyncMetrics(registry)
    jsonl = JsonlLog(cfg.run_dir / "metrics" / "weight_sync.jsonl")
    board = VersionBoard()
    # each Subscribe stream holds a worker thread for its lifetime: room for every replica twice, plus unary calls
    try:
        server = Server(bind, args.token, max_workers=64 + 2 * cfg.rollout.replicas)
    except (OSError, RuntimeError) as exc:
        print(f"weight_sync: cannot serve on {bind}: {exc}", file=sys.stderr)
        return 1
    server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server, WeightSyncServicer(board, metrics, jsonl),
               "rlfleet.v1.WeightSync")
    stop = stop_on_signals()
    server.start()
    serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
    log.info("serving rlfleet.v1.WeightSync on %s (port %d)", bind, server.port)
    serve_until(stop)
    log.info("stopping")
    board.close()
    server.stop(grace=1.0)
    jsonl.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
