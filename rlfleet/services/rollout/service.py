"""The rollout replica: loads plugins and the engine, serves rlfleet.v1.Rollout, runs the weight subscription and
the work loop until the buffer says the run is finished, then serves Generate until SIGTERM.

    python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port P]
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from rlfleet.config import Config, ConfigError
from rlfleet.data_files import DataError, rollout_source
from rlfleet.metrics import RolloutMetrics, serve_metrics
from rlfleet.plugins import PluginError, load_callable
from rlfleet.protocols import DataSource, RolloutFn
from rlfleet.rewards.scorer import Scorer, load_scorer
from rlfleet.rpc import Server, channel
from rlfleet.sample import Sample
from rlfleet.security.signing import weight_verifier
from rlfleet.service_main import ServiceArgs, listen_address, serve_until
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.engine_watch import ENGINE_UNHEALTHY_EXIT, EngineWatch, WatchSettings
from rlfleet.services.rollout.engines import make_engine
from rlfleet.services.rollout.engines.base import Engine
from rlfleet.services.rollout.messages import sampling_from_config
from rlfleet.services.rollout.openai_api.serve import start_openai_endpoint
from rlfleet.services.rollout.partial import with_partial_rollouts
from rlfleet.services.rollout.servicer import RolloutServicer
from rlfleet.services.rollout.throughput_log import ThroughputLog
from rlfleet.services.rollout.weight_updates import (
    Receivers,
    TransportReceivers,
    WeightUpdater,
    default_receivers,
    staging_capacity,
    subscribe_loop,
)
from rlfleet.services.rollout.work_loop import WorkLoop, WorkSettings
from rlfleet.v1 import rollout_pb2_grpc, weight_sync_pb2_grpc

log = logging.getLogger("rlfleet.services.rollout")


@dataclass(frozen=True)
class Plugins:
    data: DataSource
    scorer: Scorer
    rollout_fn: RolloutFn


def load_plugins(cfg: Config) -> Plugins:
    """Raises PluginError (its message names the plugin) when one cannot be imported or does not fit."""
    scorer = load_scorer(cfg.rollout.reward_fn, cfg.rollout.reward_args, cfg.rollout.reward_timeout)
    rollout_fn = load_callable(cfg.rollout.rollout_fn, "rollout.rollout_fn", RolloutFn)
    try:
        data = rollout_source(cfg)
    except DataError as exc:
        raise PluginError(str(exc)) from None
    return Plugins(data=data, scorer=scorer, rollout_fn=rollout_fn)


def _wait_for_model(path: Path, seconds: float = 300.0) -> None:
    """The model folder may still be being prepared by another process (model.prepare)."""
    deadline = time.monotonic() + seconds
    while not ((path / "config.json").exists() and any(path.glob("*.safetensors"))):
        if time.monotonic() > deadline:
            raise FileNotFoundError(f"model folder {path} has no config.json and safetensors after {seconds:.0f}s")
        time.sleep(1.0)


def run_replica(args: ServiceArgs, receivers: Receivers = default_receivers) -> int:
    cfg = args.config
    index = int(args.extra.replica_index)
    replica_id = args.extra.replica_id or f"rollout-{index}"
    try:
        plugins = load_plugins(cfg)
    except PluginError as exc:
        print(f"rollout: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if index >= len(cfg.endpoints.rollout) and not args.listen:
        print(f"rollout: --replica-index {index} has no endpoints.rollout entry and no --listen", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    _wait_for_model(cfg.model_path)
    tokenizer = AutoTokenizer.from_pretrained(str(cfg.model_path))
    engine = with_partial_rollouts(make_engine(cfg), cfg.rollout.partial_rollouts)
    stop = threading.Event()
    registry = CollectorRegistry()
    metrics = RolloutMetrics(registry, replica_id)
    serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
    ws_channel = channel(cfg.endpoints.weight_sync, args.token)
    buffer_channel = channel(cfg.endpoints.buffer, args.token)
    ws_stub = weight_sync_pb2_grpc.WeightSyncStub(ws_channel)
    if receivers is default_receivers and cfg.weight_sync.transport != "bucketed":
        receivers = transport_receivers(cfg, engine, replica_id, ws_channel)
    updater = WeightUpdater(engine, replica_id, args.token, cfg.weight_sync.update_timeout, receivers=receivers,
                            ack=lambda r: ws_stub.Ack(r, timeout=30.0), pause_mode=cfg.weight_sync.pause_mode,
                            verifier=weight_verifier(cfg.security))
    sampling = sampling_from_config(cfg.rollout.sampling)
    try:
        http = start_openai_endpoint(cfg, args.token, index, replica_id, _grpc_endpoint(cfg, index, args.listen),
                                     engine, tokenizer, sampling) if cfg.rollout.openai.enabled else None
    except (ConfigError, OSError) as exc:
        print(f"rollout: {' '.join(str(exc).split())}", file=sys.stderr)
        engine.shutdown()
        return 2
    ctx = ServiceContext(replica_id, engine, tokenizer, sampling, plugins.scorer, run_seed=cfg.run.seed,
                         openai=http.endpoint if http else None)
    settings = WorkSettings(replica_id=replica_id, run_id=cfg.run.name, claim_groups=cfg.rollout.claim_groups)
    log_name = replica_id if replica_id.startswith("rollout-") else f"rollout-{replica_id}"
    counters = ThroughputLog(cfg.run_dir / "metrics" / f"{log_name}.jsonl", replica_id, engine, metrics,
                             lambda: work.in_flight_groups)

    def on_sample(sample: Sample) -> None:
        metrics.sample_finished(sample.status.name.lower())
        metrics.reward.observe(sample.reward)
        counters.finished_samples += 1

    work = WorkLoop(buffer_channel, engine, ctx, plugins.data, plugins.rollout_fn, settings, stop, on_sample,
                    epoch_of=updater.epoch_of)
    server = Server(listen_address(cfg.endpoints.rollout[index] if index < len(cfg.endpoints.rollout) else "",
                                   args.listen), args.token)
    server.add(rollout_pb2_grpc.add_RolloutServicer_to_server,
               RolloutServicer(replica_id, engine, updater, ctx, counters, lambda: work.in_flight_groups),
               "rlfleet.v1.Rollout")
    server.start()
    counters.start()
    subscriber = threading.Thread(target=subscribe_loop, args=(ws_channel, updater, stop), name="subscribe",
                                  daemon=True)
    subscriber.start()
    log.info("replica %s serving on port %d (engine %s, weight version %d)", replica_id, server.port, engine.name,
             engine.weight_version)
    terminated = threading.Event()
    engine_lost = threading.Event()

    def on_engine_lost(reason: str) -> None:
        log.error("%s: giving up so that this replica is replaced (its groups are re-queued by its successor)",
                  reason)
        engine_lost.set()
        stop.set()
        terminated.set()              # ends serve_until once the run's claims are over, too

    EngineWatch(engine, WatchSettings(cfg.rollout.health.interval, cfg.rollout.health.failures), server.set_serving,
                on_engine_lost, stop).start()

    def on_sigterm(signum: int, frame: Any) -> None:
        terminated.set()
        work.begin_drain()              # the main thread drains once work.run() returns

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        finished = work.run()
        if not finished and terminated.is_set() and not engine_lost.is_set():
            work.drain(cfg.rollout.drain_seconds)
            log.info("replica %s drained and leaves", replica_id)
            return 0
        if finished and not terminated.is_set():
            # The trainer still evaluates through Generate and waits for replicas to fetch the final version.
            log.info("run finished: no more claims; serving Generate and weight updates until SIGTERM")
            serve_until(terminated)
            if not engine_lost.is_set():
                return 0
    finally:
        stop.set()
        work.close()
        engine.shutdown()
        counters.close()
        server.stop(grace=1.0)
        if http is not None:
            http.stop()
        ws_channel.close()
        buffer_channel.close()
    if engine_lost.is_set():
        print(f"rollout: replica {replica_id}: its engine stopped serving", file=sys.stderr)
        return ENGINE_UNHEALTHY_EXIT
    if terminated.is_set():
        log.info("terminated by SIGTERM; unfinished groups are re-queued by the buffer when their lease expires")
        return 143
    return 0 if finished else 1


def _grpc_endpoint(cfg: Config, index: int, listen: str | None) -> str:
    """Where callers reach this replica's gRPC server (what the OpenAI gateway's router health-checks)."""
    address = listen or (cfg.endpoints.rollout[index] if index < len(cfg.endpoints.rollout) else "")
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "") else address


def transport_receivers(cfg: Config, engine: Engine, replica_id: str, ws_channel: grpc.Channel) -> TransportReceivers:
    """The data planes this replica may be sent weights by (all available ones when the trainer chooses: auto)."""
    transport = cfg.weight_sync.transport
    wanted: tuple[str, ...] = (transport,)
    if transport == "auto":
        wanted = ("broadcast", "disk_delta") + (("nixl",) if importlib.util.find_spec("nixl") else ())
    capacity = staging_capacity(engine, int(cfg.weight_sync.bucket_mb * 2**20)) if "nixl" in wanted else 0
    return TransportReceivers(engine, replica_id, ws_channel, wanted, capacity_bytes=capacity,
                              device=cfg.rollout.device, join_seconds=cfg.weight_sync.join_seconds)
