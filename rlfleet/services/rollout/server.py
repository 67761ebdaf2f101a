"""The rollout replica: loads plugins and the engine, serves rlfleet.v1.Rollout, runs the weight subscription and
the work loop until the buffer says the run is finished, then serves Generate until SIGTERM (SPEC, run by
rlfleet.runtime.service_skeleton.run_service).

    python -m rlfleet.services.rollout --config X --replica-index I [--replica-id ID] [--listen H:P] [--metrics-port P]
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from rlfleet.config import Config, ConfigError, needs_reward_baseline
from rlfleet.data.files import DataError, rollout_source
from rlfleet.plugins import PluginError, load_callable
from rlfleet.protocols import DataSource, RolloutFn
from rlfleet.rewards.scorer import Scorer, load_scorer
from rlfleet.runtime.exit_codes import FAILED, OK
from rlfleet.runtime.metrics import RolloutMetrics, serve_metrics
from rlfleet.runtime.rpc import Server, channel, wait_healthy
from rlfleet.runtime.service_main import ServiceArgs, listen_address, serve_until
from rlfleet.runtime.service_skeleton import Outcome, ServiceSpec, StartError
from rlfleet.sample import Sample
from rlfleet.security.identity import Credential
from rlfleet.security.signing import weight_verifier
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.decode_profile import attach_decode_profile
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
from rlfleet.services.weight_sync.transports.auto import AUTO, candidates_here
from rlfleet.services.weight_sync.transports.registry import TRANSPORTS, transport
from rlfleet.v1 import rollout_pb2_grpc, weight_sync_pb2_grpc

log = logging.getLogger("rlfleet.services.rollout")

PEER_STARTUP_WAIT = 120.0     # seconds to wait for Buffer and WeightSync to report healthy at start (as the trainer)


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


def _wait_for_peers(cfg: Config, token: Credential, engine: Engine) -> None:
    """Buffer and WeightSync answer SERVING before the replica claims or subscribes: the launcher starts all the
    services at once, and a first Claim refused by a buffer still starting would back off for seconds."""
    for name in ("buffer", "weight_sync"):
        address = getattr(cfg.endpoints, name)
        try:
            try:
                wait_healthy(address, timeout=0.5, token=token)
            except TimeoutError:
                log.info("waiting up to %.0fs for %s at %s to answer SERVING", PEER_STARTUP_WAIT, name, address)
                wait_healthy(address, timeout=PEER_STARTUP_WAIT, token=token)
        except TimeoutError as exc:
            engine.shutdown()
            raise StartError(f"{name} at {address} is not reachable: {exc}") from None


class RolloutReplica:
    """The running replica (a rlfleet.runtime.service_skeleton.Service): engine, weight subscription, work loop, gRPC
    server,
    OpenAI endpoint and metrics, started in that order; close() stops them in the order below."""

    def __init__(self, args: ServiceArgs, receivers: Receivers = default_receivers) -> None:
        cfg = args.config
        self.cfg = cfg
        index = int(args.extra.replica_index)
        self.replica_id = replica_id = args.extra.replica_id or f"rollout-{index}"
        try:
            plugins = load_plugins(cfg)
        except PluginError as exc:
            raise StartError(str(exc)) from None
        if index >= len(cfg.endpoints.rollout) and not args.listen:
            raise StartError(f"--replica-index {index} has no endpoints.rollout entry and no --listen")
        from transformers import AutoTokenizer

        _wait_for_model(cfg.model_path)
        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model_path))
        engine = make_engine(cfg)
        attach_decode_profile(engine, cfg, replica_id)            # trainer.profile: traces of chosen versions
        self.engine = engine = with_partial_rollouts(engine, cfg.rollout.partial_rollouts)
        _wait_for_peers(cfg, args.token, engine)
        self.stop = stop = threading.Event()
        registry = CollectorRegistry()
        metrics = RolloutMetrics(registry, replica_id)
        serve_metrics(registry, args.metrics_port, cfg.security.metrics_bind)
        self.ws_channel = ws_channel = channel(cfg.endpoints.weight_sync, args.token)
        self.buffer_channel = channel(cfg.endpoints.buffer, args.token)
        ws_stub = weight_sync_pb2_grpc.WeightSyncStub(ws_channel)
        self.receivers = transport_receivers(cfg, engine, replica_id, ws_channel) \
            if receivers is default_receivers else None
        receivers = self.receivers if self.receivers is not None else receivers
        updater = WeightUpdater(engine, replica_id, args.token, cfg.weight_sync.update_timeout, receivers=receivers,
                                ack=lambda r: ws_stub.Ack(r, timeout=30.0), pause_mode=cfg.weight_sync.pause_mode,
                                verifier=weight_verifier(cfg.security))
        sampling = sampling_from_config(cfg.rollout.sampling)
        try:
            self.http = start_openai_endpoint(cfg, args.token, index, replica_id,
                                              _grpc_endpoint(cfg, index, args.listen), engine, tokenizer,
                                              sampling) if cfg.rollout.openai.enabled else None
        except (ConfigError, OSError) as exc:
            engine.shutdown()
            raise StartError(str(exc)) from None
        ctx = ServiceContext(replica_id, engine, tokenizer, sampling, plugins.scorer, run_seed=cfg.run.seed,
                             openai=self.http.endpoint if self.http else None,
                             reward_baselines=needs_reward_baseline(cfg.trainer))
        settings = WorkSettings(replica_id=replica_id, run_id=cfg.run.name, claim_groups=cfg.rollout.claim_groups)
        log_name = replica_id if replica_id.startswith("rollout-") else f"rollout-{replica_id}"
        self.counters = counters = ThroughputLog(cfg.run_dir / "metrics" / f"{log_name}.jsonl", replica_id, engine,
                                                 metrics, lambda: work.in_flight_groups)

        def on_sample(sample: Sample) -> None:
            metrics.sample_finished(sample.status.name.lower())
            metrics.reward.observe(sample.reward)
            counters.finished_samples += 1

        self.work = work = WorkLoop(self.buffer_channel, engine, ctx, plugins.data, plugins.rollout_fn, settings,
                                    stop, on_sample, epoch_of=updater.epoch_of,
                                    collector=cfg.perf.single_turn_collector)
        updater.listeners.append(work.weights_changed)
        self.server = Server(listen_address(cfg.endpoints.rollout[index] if index < len(cfg.endpoints.rollout)
                                            else "", args.listen), args.token)
        self.server.add(rollout_pb2_grpc.add_RolloutServicer_to_server,
                        RolloutServicer(replica_id, engine, updater, ctx, counters, lambda: work.in_flight_groups),
                        "rlfleet.v1.Rollout")
        self.server.start()
        counters.start()
        threading.Thread(target=subscribe_loop, args=(ws_channel, updater, stop), name="subscribe",
                         daemon=True).start()
        log.info("replica %s serving on port %d (engine %s, weight version %d)", replica_id, self.server.port,
                 engine.name, engine.weight_version)
        self.terminated = threading.Event()
        self.engine_lost = threading.Event()
        EngineWatch(engine, WatchSettings(cfg.rollout.health.interval, cfg.rollout.health.failures),
                    self.server.set_serving, self._on_engine_lost, stop).start()

    def _on_engine_lost(self, reason: str) -> None:
        log.error("%s: giving up so that this replica is replaced (its groups are re-queued by its successor)",
                  reason)
        self.engine_lost.set()
        self.stop.set()
        self.terminated.set()         # ends serve_until once the run's claims are over, too

    def signalled(self, signum: int) -> None:
        """SIGTERM: drain (the main thread drains once work.run() returns)."""
        self.terminated.set()
        self.work.begin_drain()

    def serve(self) -> Outcome:
        finished = self.work.run()
        if not finished and self.terminated.is_set() and not self.engine_lost.is_set():
            self.work.drain(self.cfg.rollout.drain_seconds)
            log.info("replica %s drained and leaves", self.replica_id)
            return Outcome()
        if finished and not self.terminated.is_set():
            # The trainer still evaluates through Generate and waits for replicas to fetch the final version.
            log.info("run finished: no more claims; serving Generate and weight updates until SIGTERM")
            serve_until(self.terminated)
            if not self.engine_lost.is_set():
                return Outcome()
        if self.engine_lost.is_set():
            return Outcome(ENGINE_UNHEALTHY_EXIT, f"replica {self.replica_id}: its engine stopped serving")
        if self.terminated.is_set():
            log.info("terminated by SIGTERM; unfinished groups are re-queued by the buffer when their lease expires")
            return Outcome(143)
        return Outcome(OK if finished else FAILED)

    def close(self) -> None:
        self.stop.set()
        self.work.close()
        self.engine.shutdown()
        self.counters.close()
        self.server.stop(grace=1.0)
        if self.http is not None:
            self.http.stop()
        if self.receivers is not None:
            self.receivers.close()
        self.ws_channel.close()
        self.buffer_channel.close()


# Requests to a frozen engine may block their threads for minutes; interpreter exit would join them. Everything
# durable is already done (samples are in the buffer; held groups go back on the next Claim): ENGINE_UNHEALTHY_EXIT
# ends the process at once.
SPEC = ServiceSpec(
    name="rollout", start=RolloutReplica, signals=(signal.SIGTERM,), exit_at_once=frozenset({ENGINE_UNHEALTHY_EXIT}),
    extra_args=((("--replica-index",), {"type": int, "required": True,
                                        "help": "which endpoints.rollout entry is ours"}),
                (("--replica-id",), {"default": None,
                                     "help": "name in the buffer and weight sync (default rollout-I)"})),
    warm=("rlfleet.services.rollout.engines.torch_engine", "transformers.modeling_utils"))


def _grpc_endpoint(cfg: Config, index: int, listen: str | None) -> str:
    """Where callers reach this replica's gRPC server (what the OpenAI gateway's router health-checks)."""
    address = listen or (cfg.endpoints.rollout[index] if index < len(cfg.endpoints.rollout) else "")
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "") else address


def transport_receivers(cfg: Config, engine: Engine, replica_id: str, ws_channel: grpc.Channel) -> TransportReceivers:
    """The data planes this replica may be sent weights by (all available ones when the trainer chooses: auto)."""
    configured = cfg.weight_sync.transport
    wanted = tuple(candidates_here().here) if configured == AUTO else (configured,)
    wanted += tuple(t.name for t in TRANSPORTS.values() if t.always_received and t.name not in wanted)
    capacity = staging_capacity(engine, int(cfg.weight_sync.bucket_mb * 2**20)) \
        if any(transport(name).needs_capacity for name in wanted) else 0
    return TransportReceivers(engine, replica_id, ws_channel, wanted, capacity_bytes=capacity,
                              device=cfg.rollout.device, join_seconds=cfg.weight_sync.join_seconds)
