"""Wire the buffer together from a config: store, filters, metrics, gRPC server. Runs until SIGTERM."""

from __future__ import annotations

import logging
import sys
import time

from prometheus_client import CollectorRegistry

from rlfleet.config import Config
from rlfleet.metrics import BufferMetrics, JsonlLog, serve_metrics
from rlfleet.plugins import PluginError
from rlfleet.rpc import Server
from rlfleet.sample_limits import model_limits
from rlfleet.security.scrub import redis_url_with_credentials
from rlfleet.service_main import listen_address, parse_service_args, serve_until, stop_on_signals
from services.buffer.core import BufferCore
from services.buffer.filters import load_filters
from services.buffer.service import SERVICE, BufferService, add_to_server
from services.buffer.settings import BufferSettings
from services.buffer.stores import StoreError
from services.buffer.stores.factory import open_store

log = logging.getLogger("buffer")
SERVICE_NAME = SERVICE


def build_core(cfg: Config, registry: CollectorRegistry | None = None, patience: float = 30.0) -> BufferCore:
    """Open the store (retrying while it is unreachable, e.g. Redis still starting) and load the state."""
    metrics = BufferMetrics(registry) if registry is not None else None
    filters = load_filters(cfg.buffer.filters)
    end = time.monotonic() + patience
    while True:
        try:
            return BufferCore(open_store(cfg), BufferSettings.from_config(cfg), filters, metrics,
                              limits=model_limits(cfg.model_path), version_lead=cfg.security.version_lead)
        except StoreError as exc:
            if time.monotonic() > end:
                raise
            log.warning("store not ready (%s); retrying", exc)
            time.sleep(1.0)


def start_server(core: BufferCore, bind: str, token: str | None) -> Server:
    server = Server(bind, token, max_workers=64,     # Claim/Put/GetBatch may each hold a worker while waiting
                    max_receive_bytes=2 * core.settings.max_sample_bytes)   # a Put of the largest sample, and more
    server.add(add_to_server, BufferService(core), SERVICE_NAME)
    server.start()
    return server


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args("buffer", argv)
    cfg = args.config
    if args.redis_auth.get("RLFLEET_REDIS_PASSWORD_FILE"):     # the chart's ACL user; the password stays in memory
        url = redis_url_with_credentials(cfg.buffer.redis_url, args.redis_auth.get("RLFLEET_REDIS_USERNAME"),
                                         args.redis_auth["RLFLEET_REDIS_PASSWORD_FILE"])
        cfg = cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"redis_url": url})})
    registry = CollectorRegistry()
    try:
        core = build_core(cfg, registry)
    except (StoreError, PluginError, RuntimeError) as exc:
        print(f"buffer: cannot start: {exc}", file=sys.stderr)
        return 1
    stop = stop_on_signals()
    bind = listen_address(cfg.endpoints.buffer, args.listen)
    server = start_server(core, bind, args.token)
    serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
    jsonl = JsonlLog(cfg.run_dir / "metrics" / "buffer.jsonl")
    log.info("buffer serving on %s (store %s, port %d)", bind, cfg.buffer.store, server.port)

    def write_stats() -> None:
        try:
            s = core.stats()
        except StoreError as exc:
            log.warning("stats unavailable: %s", exc)
            return
        jsonl.write({"service": "buffer", "stored": s.stored_samples, "ready_groups": s.ready_groups,
                     "acked": s.acked_samples, "put": s.put_samples, "dropped": dict(s.dropped)})

    serve_until(stop, write_stats, tick_every=10.0)
    server.stop(grace=2.0)
    core.close()
    jsonl.close()
    log.info("buffer stopped")
    return 0
