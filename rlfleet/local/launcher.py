"""`rlfleet run`: the four services as local processes on loopback, supervised, with progress and a report."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from rlfleet.config import Config, ConfigError, dump_config
from rlfleet.local.openai_address import GATEWAY_FILE, endpoint_note, gateway_port
from rlfleet.local.placement import thread_env
from rlfleet.local.preflight import check_run
from rlfleet.local.processes import Child, exit_reason, stop_together
from rlfleet.local.replica_activity import ReplicaActivity
from rlfleet.local.report import MetricsTail, Progress, format_summary, reward_curve, summarize
from rlfleet.local.resume_notes import resumed_note
from rlfleet.local.scale_hint import idle_replicas_hint
from rlfleet.local.scaling import ReplicaStatus, read_request, write_status
from rlfleet.local.warm_interpreters import WarmInterpreters, placements, service_env
from rlfleet.plugins import load_callable
from rlfleet.protocols import ModelPrepareFn
from rlfleet.run_dir.atomic import write_text_atomic
from rlfleet.runtime.ports import free_ports
from rlfleet.runtime.progress import PROGRESS_DIR
from rlfleet.runtime.rpc import channel, wait_healthy
from rlfleet.security.credentials import load_credential
from rlfleet.security.identity import IDENTITY_DIR_ENV, IDENTITY_ENV, Credential
from rlfleet.security.local_pki import LocalPki
from rlfleet.security.modes import security_mode
from rlfleet.security.run_material import PKI_DIR, child_secret_env, components, prepare_security
from rlfleet.security.signing import SIGNING_KEY_ENV
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc

log = logging.getLogger("rlfleet.local.launcher")

STATE_DIRS = ("buffer", "checkpoints", "metrics", "logs")
ISOLATION_NOTE = ("rlfleet: keys: each process gets only its own key folder (RUN/pki/<name>/, 0700/0600), the CA key "
                  "stays in this launcher's memory, the signing key goes to the trainer alone; all processes run as "
                  "one user, so this keeps other users out, not one component (e.g. reward code) out of another's "
                  "files: for that, use the chart")
STATE_FILES = ("trainer_done.json", "summary.json", "reward_curve.png", "config.resolved.yaml")


class RunError(RuntimeError):
    """The run could not start, or a service died."""


@dataclass
class RunResult:
    summary: dict[str, Any]
    run_dir: Path


def resolve(cfg: Config, fresh: bool, resume: bool) -> Config:
    """Prepare the run folder and the token; `with_endpoints` adds the loopback endpoints the services read."""
    run_dir = cfg.run_dir
    has_state = any((run_dir / d).exists() for d in ("buffer", "checkpoints"))
    if has_state and not (fresh or resume or cfg.run.resume):
        raise RunError(f"run folder {run_dir} holds a previous run: pass --resume to continue it or --fresh to "
                       "start over (its checkpoints and buffer are deleted; a model folder inside it is kept)")
    if fresh:
        for d in STATE_DIRS:
            shutil.rmtree(run_dir / d, ignore_errors=True)
        for f in STATE_FILES:
            (run_dir / f).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump(mode="json")
    data["security"] = prepare_security(cfg, run_dir, resume=bool(resume or cfg.run.resume))   # run CA, keys
    data["run"]["resume"] = bool(resume or cfg.run.resume)
    if cfg.rollout.openai.enabled:              # the same port after --resume: an outside agent reconnects
        data["rollout"]["openai"]["gateway_port"] = gateway_port(cfg, bool(resume or cfg.run.resume))
    data["run"]["dir"] = str(run_dir.resolve())
    data["model"]["path"] = str(cfg.model_path.resolve())
    for section in ("rollout", "eval"):              # dataset files: relative to the folder rlfleet runs in
        if data[section].get("data"):
            data[section]["data"]["path"] = str(Path(data[section]["data"]["path"]).resolve())
    return Config.model_validate(data)


def with_endpoints(cfg: Config) -> Config:
    """`cfg` with free loopback endpoints, chosen just before the services start (a port chosen minutes earlier,
    e.g. before a long model.prepare, may have been taken by then)."""
    ports = free_ports(5 + cfg.rollout.replicas)
    host = "127.0.0.1"
    data = cfg.model_dump(mode="json")
    data["endpoints"] = {
        "buffer": f"{host}:{ports[0]}", "weight_sync": f"{host}:{ports[1]}", "trainer": f"{host}:{ports[2]}",
        "trainer_data": f"{host}:{ports[3]}", "rendezvous": f"{host}:{ports[4]}",
        "rollout": [f"{host}:{p}" for p in ports[5:]],
    }
    return Config.model_validate(data)


def prepare_model(cfg: Config) -> Config:
    """Build the model folder (model.prepare) or convert a GGUF model.path once into RUN_DIR/model; returns cfg
    with model.path naming the HF folder the services load."""
    from rlfleet.weights.model_source import ModelError, converted_folder, import_gguf, is_gguf_path

    if not cfg.model_path.is_dir() and is_gguf_path(cfg.model_path) and not cfg.model.prepare:
        out = converted_folder(cfg.run_dir)
        try:                                 # prints its progress when it converts; silent when `out` is current
            import_gguf(cfg.model_path, out, cfg.model.dtype)
        except ModelError as exc:
            raise RunError(str(exc)) from None
        data = cfg.model_dump(mode="json")
        data["model"]["path"] = str(out.resolve())
        cfg = Config.model_validate(data)
    if cfg.model.prepare:
        prepare = load_callable(cfg.model.prepare, "model.prepare", ModelPrepareFn)
        log.info("preparing model folder %s with %s", cfg.model_path, cfg.model.prepare)
        prepare(str(cfg.model_path), cfg.run.seed)
    if not (cfg.model_path / "config.json").exists():
        raise RunError(f"model.path {cfg.model_path} is not a Hugging Face model folder (no config.json)")
    return cfg


def launcher_pki(cfg: Config) -> LocalPki | None:
    """A fresh in-memory run CA over RUN/pki when the launcher made that folder (mtls without a pki_dir of the
    user's); None otherwise."""
    if not security_mode(cfg.security.mode).uses_pki or not cfg.security.pki_dir:
        return None
    root = cfg.run_dir / PKI_DIR
    return LocalPki(root) if Path(cfg.security.pki_dir).resolve() == root.resolve() else None


MAX_REPLICA_RESTARTS = 3     # per rollout replica; then its death stops the run like any other service's


class LocalRun:
    """Starts and supervises the services of one run on this machine.

    A rollout replica that dies is restarted (up to max_replica_restarts times each): its first Claim tells the
    buffer to re-queue the groups it held, so none is lost. Any other service that dies stops the run.
    """

    def __init__(self, cfg: Config, config_path: Path, max_replica_restarts: int = MAX_REPLICA_RESTARTS,
                 warm: WarmInterpreters | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.run_dir = cfg.run_dir
        self.children: list[Child] = []
        self.max_replica_restarts = max_replica_restarts
        self.restarts: dict[str, int] = {}
        self.leaving: dict[str, float] = {}            # replicas scaled away: name -> monotonic time of SIGTERM
        self.next_replica = cfg.rollout.replicas          # index of the next replica `rlfleet scale` adds
        self.scale_request = ""                           # id of the scale request carried out last
        self._specs: dict[str, tuple[str, list[str], dict[str, str] | None]] = {}
        # a child's key material comes from child_secret_env alone, never from the launcher's own environment
        self.env = {k: v for k, v in service_env().items()
                    if k not in (IDENTITY_ENV, IDENTITY_DIR_ENV, SIGNING_KEY_ENV)}
        self.pki = launcher_pki(cfg)                      # the run CA, in memory: issues each process's folder
        self.operator: Credential = (self.pki.in_memory("operator", "operator") if self.pki else
                                     load_credential(cfg.security, "operator", name="operator"))  # the launcher's own
        if self.pki:
            for role, name in components(cfg):
                self.pki.issue(role, name)
        self.placement = placements(cfg)
        self.warm = warm                                  # interpreters started early, taken by _start

    def child_env(self, name: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
        """The environment process `name` starts with: the launcher's, its threads, and its own key folder only."""
        place = self.placement.get(name) or self.placement["rollout-0"]
        return {**self.env, **thread_env(place), **(extra_env or {}), **child_secret_env(self.cfg, name, self.pki)}

    def _start(self, name: str, module: str, extra: list[str], extra_env: dict[str, str] | None = None) -> Child:
        args = ["-m", module, "--config", str(self.config_path), *extra]
        # replicas added by `rlfleet scale` share the first replica's cores
        place = self.placement.get(name) or self.placement["rollout-0"]
        env = self.child_env(name, extra_env)
        log_path = self.run_dir / "logs" / f"{name}.log"
        warm = self.warm.take(name, module, place, args[2:], env, log_path) if self.warm else None
        child = Child(name, args, log_path, env, cpus=place.cpus if self.cfg.placement.pin else None, proc=warm)
        self.children.append(child)
        self._specs[name] = (module, extra, extra_env)
        return child

    def _write_processes(self) -> None:
        write_text_atomic(self.run_dir / "processes.json",
                          json.dumps({c.name: c.proc.pid for c in self.children}, indent=2))

    def _restart_replica(self, child: Child, code: int) -> bool:
        """Start a dead rollout replica again under the same name and replica id; False when out of restarts."""
        done = self.restarts.get(child.name, 0)
        if done >= self.max_replica_restarts:
            return False
        self.restarts[child.name] = done + 1
        log.warning("%s stopped (%s); restarting it (restart %d of %d); last lines of %s:\n%s", child.name,
                    exit_reason(code), done + 1, self.max_replica_restarts, child.log_path, child.tail(4))
        print(f"rlfleet: {child.name} stopped ({exit_reason(code)}); restarting it "
              f"({done + 1}/{self.max_replica_restarts}); its groups are re-queued", file=sys.stderr)
        child.stop()
        module, extra, env = self._specs[child.name]
        self.children.remove(child)
        self._start(child.name, module, extra, env)
        self._write_processes()
        return True

    def start(self) -> None:
        cfg = self.cfg
        print("rlfleet: cores (placement): " + ", ".join(
            f"{name} cpus {','.join(map(str, p.cpus))} x{p.threads} threads" for name, p in self.placement.items()),
            file=sys.stderr)
        # All at once: the trainer and the replicas each wait for Buffer and WeightSync to answer SERVING before
        # they use them, so their imports and model loads overlap the buffer's and weight_sync's start.
        self._start("buffer", "rlfleet.services.buffer", [])
        self._start("weight_sync", "rlfleet.services.weight_sync", [])
        host, _, port = cfg.endpoints.rendezvous.rpartition(":")
        for rank in range(cfg.trainer.world_size):
            self._start(f"trainer-{rank}", "rlfleet.services.trainer", [], {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(cfg.trainer.world_size),
                "MASTER_ADDR": host, "MASTER_PORT": port})
        for i in range(cfg.rollout.replicas):
            self._start(f"rollout-{i}", "rlfleet.services.rollout", ["--replica-index", str(i)])
        self._write_processes()
        self._wait([cfg.endpoints.buffer, cfg.endpoints.weight_sync], 60)
        self._wait([*cfg.endpoints.rollout, cfg.endpoints.trainer], 300)
        if cfg.rollout.openai.enabled:                # one entry point: each session to one replica
            (self.run_dir / GATEWAY_FILE).unlink(missing_ok=True)       # an earlier launch's
            self._start("openai-gateway", "rlfleet.services.rollout.openai_api", [])
            self._write_processes()
            self._announce_gateway()

    def _announce_gateway(self, timeout: float = 60.0) -> None:
        """Print the gateway's URL and where its key is, once it has written its address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_children()
            try:
                base_url = json.loads((self.run_dir / GATEWAY_FILE).read_text())["base_url"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
                continue
            print(endpoint_note(self.cfg, base_url), file=sys.stderr)
            return

    # -- scaling rollout mid-run (rlfleet/local/scaling.py)
    # ----------------------------------------------------------------

    def replicas(self) -> list[str]:
        return [c.name for c in self.children if c.name.startswith("rollout-") and c.name not in self.leaving]

    def scale_rollout(self, desired: int) -> None:
        """Start replicas up to `desired`, or send the newest ones SIGTERM (they drain, hand back and exit)."""
        running = sorted(self.replicas(), key=lambda n: int(n.split("-")[1]))
        for _ in range(desired - len(running)):
            index, self.next_replica = self.next_replica, self.next_replica + 1
            port = free_ports(1)[0]
            self._start(f"rollout-{index}", "rlfleet.services.rollout",
                        ["--replica-index", str(index), "--listen", f"127.0.0.1:{port}"])
            log.info("scale: started rollout-%d on port %d", index, port)
        for name in running[desired:][::-1] if desired < len(running) else []:
            child = next(c for c in self.children if c.name == name)
            child.terminate()
            self.leaving[name] = time.monotonic()
            log.info("scale: rollout %s leaves (draining)", name)
        self._write_processes()

    def reconcile_scale(self) -> None:
        """Carry out a new `rlfleet scale` request; report the replicas in replicas.json."""
        req = read_request(self.run_dir)
        if req is not None and req.id != self.scale_request:
            self.scale_request = req.id
            print(f"rlfleet: scaling rollout to {req.rollout} replicas", file=sys.stderr)
            hint = idle_replicas_hint(self.cfg, req.rollout)
            if hint:
                print(f"rlfleet: {hint}", file=sys.stderr)
            self.scale_rollout(req.rollout)
        drain_limit = self.cfg.rollout.drain_seconds + 30.0
        for name, since in list(self.leaving.items()):
            child = next((c for c in self.children if c.name == name), None)
            if child is None or child.returncode is not None:
                if child is not None:
                    child.stop()
                    self.children.remove(child)
                del self.leaving[name]
                self._write_processes()
                log.info("scale: %s left", name)
            elif time.monotonic() - since > drain_limit:
                log.warning("scale: %s did not drain in %.0fs; killing it", name, drain_limit)
                child.stop(grace=0.0)
        if self.scale_request:
            write_status(self.run_dir, ReplicaStatus(request=self.scale_request, desired=len(self.replicas()),
                                                     running=tuple(self.replicas()),
                                                     leaving=tuple(self.leaving)))

    def _wait(self, addresses: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for addr in addresses:
            while True:
                self._check_children()
                if self._finished(addr):
                    break                   # a short run can end before the launcher gets to ask
                try:
                    wait_healthy(addr, timeout=2.0, token=self.operator)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise RunError(self._not_healthy(addr, timeout)) from None

    def _finished(self, addr: str) -> bool:
        """Every process serving `addr` already exited 0 (e.g. a trainer that finished its steps)."""
        names = self._names_at(addr)
        done = [c for c in self.children if c.name in names and c.returncode == 0]
        return bool(names) and len(done) == len(names)

    def _not_healthy(self, addr: str, timeout: float) -> str:
        """The error for a service that never answered health checks: which one, and the end of its log."""
        names = self._names_at(addr)
        tails = "".join(f"\nlast lines of {c.log_path}:\n{c.tail()}" for c in self.children if c.name in names)
        return f"{' / '.join(names) or 'service'} at {addr} did not become healthy in {timeout:.0f}s{tails}"

    def _names_at(self, addr: str) -> list[str]:
        e = self.cfg.endpoints
        if addr == e.trainer:
            return ["trainer-0"]
        if addr in e.rollout:
            return [f"rollout-{e.rollout.index(addr)}"]
        return [n for n in ("buffer", "weight_sync") if getattr(e, n) == addr]

    def _check_children(self, trainer_done: bool = False) -> None:
        for child in list(self.children):
            code = child.returncode
            if child.name in self.leaving:
                continue                    # scaled away: reconcile_scale collects it
            if code is None or (code == 0 and (trainer_done or child.name.startswith("rollout"))):
                continue
            if code == 0 and child.name.startswith("trainer"):
                continue
            if child.name.startswith("rollout") and not trainer_done and self._restart_replica(child, code):
                continue
            raise RunError(f"{child.name} stopped ({exit_reason(code)}); last lines of {child.log_path}:\n"
                           f"{child.tail()}")

    def wait_trainers(self, seconds: float) -> None:
        """Sleep up to `seconds`, less when a trainer process exits meanwhile."""
        running = [c for c in self.children if c.name.startswith("trainer") and c.returncode is None]
        if not running:
            return
        try:
            running[0].proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def trainer_finished(self) -> bool:
        trainers = [c for c in self.children if c.name.startswith("trainer")]
        return all(c.returncode == 0 for c in trainers)

    def buffer_stats(self) -> dict[str, Any] | None:
        try:
            with channel(self.cfg.endpoints.buffer, self.operator) as ch:
                stats = buffer_pb2_grpc.BufferStub(ch).Stats(buffer_pb2.StatsRequest(), timeout=5.0)
        except grpc.RpcError:
            return None
        return {"put_samples": stats.put_samples, "acked_samples": stats.acked_samples,
                "dropped": dict(stats.dropped), "stored_samples": stats.stored_samples,
                "next_prompt_index": stats.next_prompt_index, "ready_groups": stats.ready_groups,
                "partial_groups": stats.partial_groups, "tickets_in_flight": stats.tickets_in_flight}

    def stop(self) -> None:
        """Replicas first (each hands back what it holds while the buffer still serves), then the rest at once."""
        replicas = [c for c in self.children if c.name.startswith("rollout")]
        stop_together(replicas)
        stop_together([c for c in reversed(self.children) if c not in replicas])


def run(cfg: Config, source: Path, fresh: bool = False, resume: bool = False) -> RunResult:
    # the trainer ranks' and replicas' interpreters import while the launcher checks and prepares
    # (rlfleet/local/warm_interpreters.py); every one not taken by the services' start ends with the preflight's failure
    warm = WarmInterpreters(cfg)
    try:
        check_run(cfg, trainer_check=warm.check_trainer)
        resolved = prepare_model(resolve(cfg, fresh=fresh, resume=resume))
        if resolved.run.resume:
            print(resumed_note(resolved.run_dir, resolved.trainer.steps), file=sys.stderr)
        resolved = with_endpoints(resolved)
        config_path = resolved.run_dir / "config.resolved.yaml"
        dump_config(resolved, config_path)
        return _run(resolved, config_path, source, warm)
    finally:
        warm.close()


def _run(resolved: Config, config_path: Path, source: Path, warm: WarmInterpreters) -> RunResult:
    local = LocalRun(resolved, config_path, warm=warm)
    shutil.rmtree(resolved.run_dir / PROGRESS_DIR, ignore_errors=True)     # phases of an earlier invocation
    progress = Progress(resolved.trainer.steps, run_dir=resolved.run_dir, eval_every=resolved.eval.every_steps,
                        has_eval=resolved.has_eval)
    tail = MetricsTail(resolved.run_dir / "metrics" / "trainer.jsonl")
    activity = ReplicaActivity(resolved.run_dir / "metrics")
    started = time.monotonic()
    drawing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-curve")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGINT too, explicitly: a process started in the background of a script inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler, so `kill -INT` (or Ctrl-C relayed by a supervisor) did nothing
    previous = signal.signal(signal.SIGTERM, on_signal)
    previous_int = signal.signal(signal.SIGINT, on_signal)
    try:
        print(f"rlfleet: run '{resolved.run.name}' in {resolved.run_dir} (from {source}); logs in "
              f"{resolved.run_dir / 'logs'}", file=sys.stderr)
        if local.pki is not None:
            print(ISOLATION_NOTE, file=sys.stderr)
        local.start()
        while not local.trainer_finished():
            local.reconcile_scale()
            local._check_children()
            progress.update(tail.read(), idle=activity.idle(local.replicas()))
            local.wait_trainers(0.5)             # returns as soon as the trainer exits
        progress.update(tail.read())
        progress.close()
        # the trainer wrote its last metrics: the curve is drawn while the services stop
        curve = drawing.submit(reward_curve, resolved.run_dir / "metrics" / "trainer.jsonl",
                               resolved.run_dir / "reward_curve.png")
        stats = local.buffer_stats()
        local._check_children(trainer_done=True)
    finally:
        local.stop()
        drawing.shutdown(wait=True)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    summary = summarize(resolved.run_dir / "metrics" / "trainer.jsonl", time.monotonic() - started, stats)
    summary["replica_restarts"] = dict(local.restarts)
    curve.result()
    write_text_atomic(resolved.run_dir / "summary.json", json.dumps(summary, indent=2))
    print(format_summary(summary, resolved.run_dir), file=sys.stderr)
    return RunResult(summary=summary, run_dir=resolved.run_dir)


__all__ = ["ConfigError", "LocalRun", "RunError", "run"]
