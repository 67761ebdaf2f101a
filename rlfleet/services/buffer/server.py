"""Wire the buffer together from a config: store, filters, metrics, gRPC server (SPEC, run by
rlfleet.runtime.service_skeleton.run_service). Runs until SIGTERM."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry

from rlfleet.config import Config
from rlfleet.plugins import PluginError
from rlfleet.run_dir.committed_ids import committed_after
from rlfleet.runtime.exit_codes import FAILED, GAVE_UP
from rlfleet.runtime.metrics import BufferMetrics, JsonlLog, serve_metrics
from rlfleet.runtime.rpc import Server
from rlfleet.runtime.service_main import ServiceArgs, listen_address, serve_until
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec, StartError
from rlfleet.sample.limits import model_limits, put_max_seq_len
from rlfleet.security.identity import Credential
from rlfleet.security.scrub import redis_url_with_credentials
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.filters import load_filters
from rlfleet.services.buffer.service import SERVICE, BufferService, add_to_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.stores.embedded import LogCorrupt
from rlfleet.services.buffer.stores.factory import open_store

log = logging.getLogger("buffer")
SERVICE_NAME = SERVICE


def build_core(cfg: Config, registry: CollectorRegistry | None = None, patience: float = 30.0) -> BufferCore:
    """Open the store (retrying while it is unreachable, e.g. Redis still starting; a corrupt log is refused at
    once) and load the state; samples the
    trainer's checkpoints committed after the store's last Ack are dropped (reason `trained`), never delivered."""
    metrics = BufferMetrics(registry) if registry is not None else None
    filters = load_filters(cfg.buffer.filters)
    end = time.monotonic() + patience
    while True:
        try:
            limits = replace(model_limits(cfg.model_path),
                             max_seq_len=put_max_seq_len(cfg.trainer.max_seq_len, cfg.model_path))
            core = BufferCore(open_store(cfg), BufferSettings.from_config(cfg), filters, metrics,
                              limits=limits, version_lead=cfg.security.version_lead)
            core.drop_trained(committed_after(cfg.run_dir, core.state.committed_step))
            return core
        except StoreError as exc:
            if isinstance(exc, LogCorrupt) or time.monotonic() > end:   # a damaged log does not heal: refuse now
                raise
            log.warning("store not ready (%s); retrying", exc)
            time.sleep(1.0)


def write_stats(core: BufferCore, jsonl: JsonlLog) -> None:
    """One record of the buffer's stats in its metrics log (each 10 s)."""
    try:
        s = core.stats()
    except StoreError as exc:
        log.warning("stats unavailable: %s", exc)
        return
    jsonl.write({"service": "buffer", "stored": s.stored_samples, "ready_groups": s.ready_groups,
                 "acked": s.acked_samples, "put": s.put_samples, "dropped": dict(s.dropped)})


def start_server(core: BufferCore, bind: str, token: Credential) -> Server:
    server = Server(bind, token, max_workers=64,     # Claim/Put/GetBatch may each hold a worker while waiting
                    max_receive_bytes=2 * core.settings.max_sample_bytes)   # a Put of the largest sample, and more
    server.add(add_to_server, BufferService(core), SERVICE_NAME)
    server.start()
    return server


def watch_health(core: BufferCore, server: Server, stop: threading.Event, every: float = 1.0) -> threading.Thread:
    """Health follows the store: NOT_SERVING while it keeps failing (probed each `every` s, so it returns to SERVING
    when the disk or Redis does); a superseded buffer (a newer writer epoch) sets stop: it must exit."""

    def loop() -> None:
        serving = True
        while not stop.wait(every):
            ok = core.healthy()
            if ok != serving:
                serving = ok
                status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
                for name in ("", SERVICE_NAME):
                    server.health.set(name, status)
                (log.info if ok else log.error)("store %s: health %s", "recovered" if ok else "failing",
                                                "SERVING" if ok else "NOT_SERVING")
            if core.superseded.is_set():
                stop.set()

    thread = threading.Thread(target=loop, name="buffer-health", daemon=True)
    thread.start()
    return thread


class BufferServer:
    """The running buffer (a rlfleet.runtime.service_skeleton.Service): store and core, gRPC server, metrics,
    health watch."""

    def __init__(self, args: ServiceArgs) -> None:
        cfg = args.config
        if args.redis_auth.get("RLFLEET_REDIS_PASSWORD_FILE"):   # the chart's ACL user; the password stays in memory
            url = redis_url_with_credentials(cfg.buffer.redis_url, args.redis_auth.get("RLFLEET_REDIS_USERNAME"),
                                             args.redis_auth["RLFLEET_REDIS_PASSWORD_FILE"])
            cfg = cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"redis_url": url})})
        registry = CollectorRegistry()
        try:
            self.core = build_core(cfg, registry)
        except (StoreError, PluginError, RuntimeError) as exc:
            raise StartError(f"cannot start: {exc}", FAILED) from None
        self.stop = threading.Event()
        bind = listen_address(cfg.endpoints.buffer, args.listen)
        self.server = start_server(self.core, bind, args.token)
        serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
        self.metrics = self.core.metrics
        self.jsonl = JsonlLog(cfg.run_dir / "metrics" / "buffer.jsonl", on_error=self._log_record_dropped)
        log.info("buffer serving on %s (store %s, port %d)", bind, cfg.buffer.store, self.server.port)
        watch_health(self.core, self.server, self.stop)

    def _log_record_dropped(self, exc: OSError) -> None:
        """A metrics record the disk did not take: dropped and counted, never raised out of the serve loop."""
        if self.metrics is not None:
            self.metrics.dropped_log_records.inc()
        if self.jsonl.dropped == 1 or self.jsonl.dropped % 100 == 0:
            log.warning("metrics log %s: cannot write (%s); records dropped so far: %d", self.jsonl.path, exc,
                        self.jsonl.dropped)

    def _write_stats(self) -> None:
        write_stats(self.core, self.jsonl)

    def serve(self) -> Outcome:
        serve_until(self.stop, self._write_stats, tick_every=10.0)
        if self.core.superseded.is_set():
            return Outcome(GAVE_UP, "superseded by a newer buffer on the same store (writer epoch); exiting")
        return Outcome()

    def signalled(self, signum: int) -> None:
        self.stop.set()

    def close(self) -> None:
        self.server.stop(grace=2.0)
        self.core.close()
        self.jsonl.close()
        if not self.core.superseded.is_set():
            log.info("buffer stopped")


SPEC = ServiceSpec(name="buffer", start=BufferServer)
