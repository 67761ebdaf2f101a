"""The trainer service: the loop of docs/architecture.md "The trainer step" on every rank; rank 0 also talks to
Buffer and WeightSync, serves rlfleet.v1.Trainer and writes the metrics."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from torch.profiler import record_function

from rlfleet.config import Config, ConfigError, check_trainer
from rlfleet.plugins import load_hooks
from rlfleet.run_dir import lineage
from rlfleet.run_dir.atomic import write_bytes_atomic, write_text_atomic
from rlfleet.runtime.metrics import TrainerMetrics, serve_metrics
from rlfleet.runtime.rpc import Server, wait_healthy
from rlfleet.runtime.service_main import listen_address
from rlfleet.runtime.torch_profile import StepProfiler
from rlfleet.sample.limits import model_limits
from rlfleet.security.identity import Credential
from rlfleet.security.signing import Signer, weight_verifier
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.algorithms import resolve, skips_zero_advantage
from rlfleet.services.trainer.backends import TrainerBackend, backend_spec, make_backend
from rlfleet.services.trainer.backends.fsdp import init_distributed, trainer_device
from rlfleet.services.trainer.batch import rank_groups
from rlfleet.services.trainer.batch_check import BatchLimits, BatchUnusable, check_batch
from rlfleet.services.trainer.batch_stats import batch_stats
from rlfleet.services.trainer.checkpoint_seal import latest_sealed, seal
from rlfleet.services.trainer.clients import BufferClient, PeerError, WeightSyncClient
from rlfleet.services.trainer.collectives import all_reduce_sum, broadcast_bytes
from rlfleet.services.trainer.dashboards import MetricsLog
from rlfleet.services.trainer.distributed_exit import collective_threads, leave_distributed
from rlfleet.services.trainer.evaluation import Evaluator
from rlfleet.services.trainer.hf_export import export_checkpoint, write_final
from rlfleet.services.trainer.hooks import call_hooks
from rlfleet.services.trainer.leader_wait import heartbeat_seconds, leader_work
from rlfleet.services.trainer.publisher import WeightPublisher, follow_publish
from rlfleet.services.trainer.resume_report import report_resume
from rlfleet.services.trainer.servicer import TrainerServicer, TrainerState
from rlfleet.services.trainer.step import StepContext
from rlfleet.services.weight_sync.transports.sharded import ShardedState
from rlfleet.v1 import buffer_pb2, trainer_pb2_grpc

log = logging.getLogger(__name__)

PEER_STARTUP_WAIT = 120.0     # seconds to wait for Buffer and WeightSync to report healthy at start
MAX_REJECTS_IN_A_ROW = 20     # unusable batches for one step before the trainer gives up (a config error, likely)


def validate(cfg: Config, world_size: int) -> None:
    """Raise ConfigError for a trainer config this world size cannot run: WORLD_SIZE and the endpoints here, what
    the config alone decides in rlfleet.config.check_trainer."""
    t = cfg.trainer
    if t.world_size != world_size:
        raise ConfigError(f"trainer.world_size={t.world_size} but WORLD_SIZE={world_size}")
    check_trainer(cfg)          # the refusals `rlfleet check` gives too (rlfleet/config/trainer_checks.py)
    for name in ("buffer", "weight_sync", "trainer", "trainer_data"):
        if not getattr(cfg.endpoints, name):
            raise ConfigError(f"endpoints.{name} is empty")
    if t.checkpoint_every % t.publish_every:
        log.warning("trainer.checkpoint_every=%d is not a multiple of publish_every=%d: a resumed trainer "
                    "re-publishes weights that differ from those first published under its version",
                    t.checkpoint_every, t.publish_every)


@dataclass
class Leader:
    """Rank 0's connections and outputs."""

    state: TrainerState
    server: Server
    buffer: BufferClient
    weight_sync: WeightSyncClient
    publisher: WeightPublisher
    evaluator: Evaluator | None
    jsonl: MetricsLog
    prom: TrainerMetrics

    def close(self) -> None:
        for closer in (self.publisher.close, self.buffer.close, self.weight_sync.close, self.jsonl.close,
                       lambda: self.server.stop(0.5), self.evaluator.close if self.evaluator else None):
            if closer is None:
                continue
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("closing: %s", exc)


class Trainer:
    """One rank of the trainer. `run()` trains to trainer.steps and returns the summary (rank 0)."""

    def __init__(self, cfg: Config, token: Credential, rank: int, world_size: int, listen: str | None = None,
                 metrics_port: int = 0) -> None:
        validate(cfg, world_size)
        self.cfg, self.token, self.rank, self.world_size = cfg, token, rank, world_size
        self.listen, self.metrics_port = listen, metrics_port
        self.run_dir = cfg.run_dir
        if cfg.trainer.threads is not None:        # else OMP_NUM_THREADS: the launcher's placement (issue 15)
            torch.set_num_threads(cfg.trainer.threads)
        torch.manual_seed(cfg.run.seed + rank)
        self.device = trainer_device(cfg.trainer.device, rank)
        self.hooks = load_hooks(cfg.trainer.hooks)
        advantage_fn, loss_fn = resolve(cfg.trainer)
        t = cfg.trainer
        self.ctx = StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=self.hooks,
                               temperature=cfg.rollout.sampling.temperature, minibatches=t.minibatches,
                               grad_clip=t.grad_clip, world_size=world_size, device=self.device,
                               entropy_grad=t.policy_loss.entropy_coef > 0, single_pass=cfg.perf.single_pass,
                               skip_zero_advantage=cfg.perf.skip_zero_advantage and
                               skips_zero_advantage(t, loss_fn))
        self.leader: Leader | None = None
        self.limits = BatchLimits(max_seq_len=t.max_seq_len, vocab_size=model_limits(cfg.model_path).vocab_size)
        self.version = 0
        self.committed = -1
        self.ack_due: int | None = None     # rank 0: a committed step not yet acked; rides on the next GetBatch

    # -- start-up -------------------------------------------------------------------------------------------------

    def _start_leader(self) -> Leader:
        cfg = self.cfg
        state = TrainerState(total_steps=cfg.trainer.steps, world_size=self.world_size)
        server = Server(listen_address(cfg.endpoints.trainer, self.listen), self.token)
        server.add(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(state), "rlfleet.v1.Trainer")
        server.start()
        registry = CollectorRegistry()
        prom = TrainerMetrics(registry)
        serve_metrics(registry, self.metrics_port, cfg.security.metrics_bind)
        for name in ("buffer", "weight_sync"):
            address = getattr(cfg.endpoints, name)
            try:
                wait_healthy(address, timeout=PEER_STARTUP_WAIT, token=self.token)
            except TimeoutError as exc:
                server.stop(0)
                raise RuntimeError(f"{name} at {address} is not reachable: {exc}") from None
        ws = WeightSyncClient(cfg.endpoints.weight_sync, self.token)
        evaluator = Evaluator(cfg, self.token) if cfg.has_eval else None
        return Leader(state=state, server=server, buffer=BufferClient(cfg.endpoints.buffer, self.token),
                      weight_sync=ws, publisher=WeightPublisher(cfg, self.token, ws, model_bytes=_model_bytes(cfg),
                                                                   device=self.device),
                      evaluator=evaluator,
                      jsonl=MetricsLog(self.run_dir / "metrics" / "trainer.jsonl", cfg), prom=prom)

    def _resume(self, backend: TrainerBackend) -> int:
        """Load the newest checkpoint when run.resume is set; returns the first step to train."""
        if not self.cfg.run.resume:
            if self.rank == 0 and checkpoint.latest(self.run_dir) is not None:
                log.warning("%s holds checkpoints but run.resume is false: starting from the model at step 0",
                            self.run_dir)
            return 0
        info = latest_sealed(self.run_dir, weight_verifier(self.cfg.security))   # only what this run's trainer signed
        if info is None:
            log.info("run.resume is set but %s holds no complete checkpoint: starting at step 0", self.run_dir)
            return 0
        backend.load_checkpoint(info)
        self.version, self.committed = info.version, info.step
        log.info("resumed from %s: step %d, version %d", info.path, info.step, info.version)
        if self.leader:
            self.leader.state.update(step=info.step + 1, weight_version=info.version, last_checkpoint=str(info.path))
        return info.step + 1

    def _take_lineage(self, resumed: bool) -> None:
        """Rank 0: this incarnation's epoch joins the run's lineage (rlfleet/run_dir/lineage.py) at the version it
        starts
        from, and every GetBatch names the lineage, so the buffer drops samples of versions an earlier incarnation
        published past its last checkpoint. A fresh start descends from nothing stored."""
        assert self.leader is not None
        path = self.run_dir / "trainer" / lineage.FILE_NAME
        earlier = lineage.load(path) if resumed else []
        chain = lineage.extend(earlier, self.leader.publisher.epoch, self.version)
        lineage.save(path, chain)
        self.leader.buffer.lineage = chain
        log.info("trainer epoch %d from version %d; lineage of %d epoch(s)", chain[-1].epoch, self.version, len(chain))

    def _report_start(self, start: int) -> int:
        """Collective. Rank 0 reports the start to the buffer (rlfleet.services.trainer.resume_report: it drops what
        the checkpoints it missed committed and acknowledges the checkpoint's steps, or refuses a checkpoint older
        than its committed step); every rank gets the first step to train, or the refusal, before any GetBatch."""
        if self.leader:
            try:
                first = report_resume(self.leader.buffer, self.run_dir, self.committed,
                                      self.cfg.run.allow_older_checkpoint)
                verdict: dict[str, int | str] = {"start": first}
            except PeerError as exc:
                verdict = {"refused": str(exc)}
            data = broadcast_bytes(json.dumps(verdict).encode(), self.device)
        else:
            data = broadcast_bytes(None, self.device)
        got = json.loads(data)
        if "refused" in got:
            raise RuntimeError(f"the buffer refused this trainer's start: {got['refused']}")
        if got["start"] > start:        # run.allow_older_checkpoint: on after the buffer's committed step
            log.warning("starting at step %d, after the buffer's committed step (the checkpoint was of step %d)",
                        got["start"], self.committed)
            self.committed = got["start"] - 1
            if self.leader:
                self.leader.state.update(step=got["start"])
        return int(got["start"])

    # -- pieces of a step -----------------------------------------------------------------------------------------

    def _publish(self, backend: TrainerBackend, version: int, step: int) -> None:
        """Collective. The backend's publish_state: a ShardedState (FSDP) is gathered one parameter at a time while
        rank 0's sender stages it, every rank iterating together; a full state dict (Megatron: its HF conversion
        needs whole tensors) is gathered on rank 0, which publishes it."""
        state = backend.publish_state()
        if self.leader:
            self.leader.publisher.publish(version, step, state, adapter=backend.adapter_options,
                                          options=backend.publish_options())
            self.leader.prom.weight_version.set(version)
            self.leader.state.update(weight_version=version)
        elif isinstance(state, ShardedState):
            follow_publish(state, self.device, version=version, step=step)
        self.version = version

    def _checkpoint(self, backend: TrainerBackend, step: int, final: bool) -> None:
        """Save; the buffer acknowledges the step's batches (and earlier ones) once the checkpoint is on disk: by the
        next step's GetBatch (ack_through_step), or by an Ack call after the last step."""
        path = backend.save_checkpoint(self.run_dir, step, self.version, self.cfg.trainer.keep_checkpoints)
        if self.leader:
            export_checkpoint(path)                  # hf/model.safetensors: loadable with from_pretrained
        # the seal covers every file, hf/model.safetensors too: sealed after the export (sealed before it, every
        # checkpoint failed its seal on resume and the trainer started again from step 0)
        if self.rank == 0 and self.cfg.security.signing_key:
            seal(path, Signer.from_file(self.cfg.security.signing_key))
        call_hooks(self.hooks, "after_save", step, str(path))
        if self.leader:
            self.leader.state.checkpoint_taken(step, str(path))
            if final:
                acked = self.leader.buffer.ack(step)
                log.info("checkpoint %s; acked %d samples up to step %d", path, acked, step)
            else:
                self.ack_due = step
                log.info("checkpoint %s; step %d is acked with the next GetBatch", path, step)
        self.committed = step

    def _evaluate(self, step: int) -> dict[str, float]:
        """Rank 0 evaluates on the replicas; the other ranks wait for it in heartbeat broadcasts (leader_wait.py)."""
        if not self.cfg.has_eval:
            return {}
        if not self.leader:
            leader_work(None, self.device, self._heartbeat, "evaluation")
            return {}
        leader = self.leader

        def run() -> dict[str, float]:
            assert leader.evaluator is not None
            steps = self.cfg.trainer.steps
            phase = ("evaluation before training" if step == 0 else "evaluation after training" if step >= steps
                     else f"evaluation at step {step}")
            metrics = leader.evaluator.run(self.version, step, phase)
            leader.jsonl.write({"step": step, "version": self.version, **metrics})
            return metrics
        return leader_work(run, self.device, self._heartbeat, "evaluation") or {}

    def _fetch_batch(self, step: int) -> buffer_pb2.Batch:
        """Rank 0 broadcasts the batch's bytes as the buffer sent them (never serialized again) and keeps the parsed
        Batch; the other ranks parse them."""
        if self.leader:
            # however long rollout takes to fill it, the other ranks' collectives last a heartbeat each
            got = leader_work(lambda: self._usable_batch(step), self.device, self._heartbeat, "batch")
            assert got is not None
            batch, data = got
            broadcast_bytes(data, self.device)
            return batch
        leader_work(None, self.device, self._heartbeat, "batch")
        return buffer_pb2.Batch.FromString(broadcast_bytes(None, self.device))

    @property
    def _heartbeat(self) -> float:
        return heartbeat_seconds(self.cfg.trainer.collective_timeout_s)

    def _usable_batch(self, step: int) -> tuple[buffer_pb2.Batch, bytes]:
        """Rank 0: the batch for `step` (and its bytes), after quarantining (Buffer.Reject) every group this trainer
        cannot train on and asking again (rlfleet.services.trainer.batch_check): bad data never crash-loops it."""
        assert self.leader is not None
        for _ in range(MAX_REJECTS_IN_A_ROW):
            batch, data = self.leader.buffer.get_batch_bytes(step, self.cfg.trainer.groups_per_step, self.version,
                                                             self.ack_due)
            if self.ack_due is not None:
                log.info("acked %d samples up to step %d (with GetBatch for step %d)", batch.acked_samples,
                         self.ack_due, step)
                self.ack_due = None
            try:
                check_batch(batch, self.limits)
                return batch, data
            except BatchUnusable as exc:
                self._quarantine(batch, exc)
        raise RuntimeError(f"step {step}: {MAX_REJECTS_IN_A_ROW} batches in a row held groups this trainer cannot "
                           f"use (see {self.run_dir / 'quarantine'}); check trainer.max_seq_len and the model")

    def _quarantine(self, batch: buffer_pb2.Batch, exc: BatchUnusable) -> None:
        """Keep the rejected samples and the reasons in RUN_DIR/quarantine/ for a look, then Buffer.Reject them."""
        assert self.leader is not None
        bad = buffer_pb2.Batch(step=batch.step, group_ids=list(exc.groups),
                               samples=[m for m in batch.samples if m.group_id in exc.groups])
        stem = self.run_dir / "quarantine" / f"step_{exc.step:08d}_{next(iter(exc.groups))}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(stem.with_suffix(".batch.pb"), bad.SerializeToString())
        write_text_atomic(stem.with_suffix(".json"), json.dumps({"step": exc.step, "groups": exc.groups}, indent=1))
        reply = self.leader.buffer.reject(exc.step, exc.groups)
        log.warning("%s: quarantined (%d samples, kept in %s); %d groups of the batch ready again", exc,
                    reply.quarantined_samples, stem.parent, reply.requeued_groups)

    def _log_step(self, step: int, metrics: dict[str, float], step_s: float, wait_s: float, redelivered: bool) -> None:
        if not self.leader:
            return
        record: dict[str, Any] = {"step": step, **metrics, "step_seconds": step_s, "wait_seconds": wait_s,
                                  "version": self.version, "redelivered": redelivered,
                                  "samples_per_s": metrics["samples"] / max(step_s + wait_s, 1e-9),
                                  "tokens_per_s": metrics.get("tokens", 0.0) / max(step_s + wait_s, 1e-9)}
        self.leader.jsonl.write(record)
        p = self.leader.prom
        p.step.set(step + 1)
        p.last_step_time.set(time.time())
        p.step_seconds.observe(step_s)
        p.batch_wait_seconds.observe(wait_s)
        p.loss.set(metrics["loss"])
        p.reward.set(metrics["reward_mean"])
        p.tis_ratio.set(metrics.get("tis_weight_mean", 0.0))
        p.tis_clip.set(metrics.get("tis_clip_fraction", 0.0))
        p.logprob_diff.set(metrics.get("logprob_abs_diff", 0.0))
        self.leader.state.update(step=step + 1, metrics={k: float(v) for k, v in metrics.items()})

    # -- the loop -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Join the process group, start rank 0's connections and train; call close() after, also on an error."""
        init_distributed(self.cfg.endpoints.rendezvous, self.rank, self.world_size, self.device,
                         timedelta(seconds=self.cfg.trainer.collective_timeout_s))
        if self.rank == 0:
            self.leader = self._start_leader()
        return self._train()

    def close(self) -> None:
        if self.leader:
            self.leader.close()
        # _train has returned: nothing here holds the model, so the groups end now
        leave_distributed(backend_spec(self.cfg.trainer.backend).release)
        alive = collective_threads()
        if alive:
            log.warning("torch.distributed threads still alive after leaving the process group (%s): something "
                        "still holds the model or a DTensor; the process may abort at exit", ", ".join(alive))

    def _train(self) -> dict[str, Any]:
        t = self.cfg.trainer
        backend = make_backend(self.cfg, self.rank, self.world_size, self.device, self.hooks)
        profiler = StepProfiler(t.profile, self.run_dir, self.rank, self.device)
        data_rank, data_world = backend.data_rank, backend.data_world
        self.ctx = replace(self.ctx, pad_id=backend.pad_id)
        start = self._resume(backend)
        if self.leader:
            self._take_lineage(resumed=start > 0)
        start = self._report_start(start)
        self._publish(backend, self.version, max(self.committed, 0))
        eval_metrics = self._evaluate(start) if start < t.steps else {}
        last: dict[str, float] = {}
        for step in range(start, t.steps):
            t0 = time.monotonic()
            batch = self._fetch_batch(step)
            t1 = time.monotonic()
            final = step == t.steps - 1
            with profiler.step(step):                    # trainer.profile: a trace of the listed steps
                with record_function("rlfleet.train_step"):
                    last = backend.train_step(rank_groups(batch, data_rank, data_world, t.minibatches), step,
                                              self.ctx)
                t2 = time.monotonic()
                with record_function("rlfleet.publish"):
                    if (step + 1) % t.publish_every == 0:
                        self._publish(backend, (step + 1) // t.publish_every, step)
                    elif final:                          # the last weights always reach the replicas
                        self._publish(backend, self.version + 1, step)
            t3 = time.monotonic()
            requested = self.leader is not None and self.leader.state.checkpoint_requested()
            requested = all_reduce_sum([float(requested)], self.device)[0] > 0
            if final or requested or (step + 1) % t.checkpoint_every == 0:
                self._checkpoint(backend, step, final)
            t4 = time.monotonic()
            last = {**last, **batch_stats(batch), "train_seconds": t2 - t1, "publish_seconds": t3 - t2,
                    "checkpoint_seconds": t4 - t3}
            self._log_step(step, last, t4 - t1, t1 - t0, batch.redelivered)
            if t.steps and self.cfg.eval.every_steps and (step + 1) % self.cfg.eval.every_steps == 0 and not final:
                self._evaluate(step + 1)
        return self._finish(last, eval_metrics)

    def _finish(self, last: dict[str, float], eval_before: dict[str, float]) -> dict[str, Any]:
        if not self.leader:                               # wait out rank 0's checks in heartbeats (leader_wait.py)
            leader_work(None, self.device, self._heartbeat, "final verify")
            self._evaluate(self.cfg.trainer.steps)
            return {}
        weight_sync = self.leader.weight_sync
        verify = leader_work(lambda: weight_sync.verify(self.version, self.cfg.weight_sync.update_timeout),
                             self.device, self._heartbeat, "final verify")
        assert verify is not None
        if not verify.all_current:
            log.warning("not every replica acknowledged the final version %d", self.version)
        eval_after = self._evaluate(self.cfg.trainer.steps)
        if self.leader.state.last_checkpoint:
            write_final(Path(self.leader.state.last_checkpoint), Path(self.run_dir), self.cfg.model.dtype)
        self.leader.state.update(finished=True)
        summary = {"finished": True, "steps": self.cfg.trainer.steps, "committed_step": self.committed,
                   "version": self.version,
                   "last_checkpoint": self.leader.state.last_checkpoint, "world_size": self.world_size,
                   "final_metrics": last, "eval_before": eval_before, "eval_after": eval_after,
                   "replicas_current": bool(verify.all_current)}
        write_text_atomic(Path(self.run_dir) / "trainer_done.json", json.dumps(summary, indent=1, default=float))
        return summary


def _model_bytes(cfg: Config) -> int:
    """Size of the model's safetensors files: what `weight_sync.transport: auto` chooses a transport for."""
    return sum(f.stat().st_size for f in Path(cfg.model_path).glob("*.safetensors"))
