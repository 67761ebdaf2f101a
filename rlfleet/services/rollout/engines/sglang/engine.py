"""The SGLang engine: a rollout replica's Engine backed by a real SGLang server, driven over its native HTTP API.

submit -> POST /generate with input_ids, sampling params and return_logprob (one HTTP call per request, on a thread
pool as wide as the replica's batch); output_ids and meta_info.output_token_logprobs map to the Generation exactly.
Weight updates (verified tensors from rlfleet.services.weight_sync) go through SGLang's own calls inside a
/begin_weight_update ... /end_weight_update session:
  - "disk": the tensors are written atomically as a safetensors folder, then /update_weights_from_disk loads it;
  - "distributed": a gloo group with the server (this process rank 0), /update_weights_from_distributed while the
    tensors are broadcast (the bucketed-pipeline path; NCCL on GPUs).
(update_weights_from_tensor of sglang.Engine needs the engine in this process; over HTTP these two are the paths.)
An update with requests in flight pauses generation in place, loads, and continues: those requests keep their KV and
finish under the new weights, and SGLang's meta_info.weight_versions records the version of each token span. The
server runs with its radix cache off by default (SGLangServerSpec), so no prefix KV of old weights is reused; when the
server is idle the update also flushes the cache.
MoE models (R3): like the torch engine, a MoE model folder means routes are recorded: the request asks for them
and the answer's are converted to the torch engine's per-token layout (routes.py); the server must run with
--enable-return-routed-experts (SGLangServerSpec.return_routed_experts; engine_from_config sets it).
named_weights reads what the server holds back through /get_weights_by_name (HF names, SGLang maps its stacked
qkv / gate_up itself), so the digest the replica acknowledges is of the served weights, not of what was sent.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import EngineError, EngineStats, Pausable, check_request
from rlfleet.services.rollout.engines.sglang.client import SGLangClient, SGLangError
from rlfleet.services.rollout.engines.sglang.group import broadcast_tensors, new_group, run_beside
from rlfleet.services.rollout.engines.sglang.protocol import generate_body, parse_generate_response
from rlfleet.services.rollout.engines.sglang.routes import moe_shape
from rlfleet.services.rollout.engines.sglang.server import SGLangServer, free_port
from rlfleet.services.rollout.engines.sglang.weights import (
    held_specs,
    prune_weights_folders,
    read_back,
    write_weights_folder,
)
from rlfleet.services.rollout.engines.weights import check_update

log = logging.getLogger(__name__)

WeightPath = Literal["disk", "distributed"]
Verify = Literal["read_back", "sent"]


class SGLangEngine(Pausable):
    name = "sglang"

    def __init__(self, client: SGLangClient, model_path: str | Path, *, weight_path: WeightPath = "disk",
                 max_concurrency: int = 64, work_dir: Path | None = None, weight_version: int = 0,
                 group_host: str = "127.0.0.1", server: SGLangServer | None = None,
                 verify: Verify = "read_back") -> None:
        """client: the server's API. model_path: the folder the server loaded (names, shapes, dtypes of its weights).
        server: a local server this engine owns and stops on shutdown (None: someone else runs it).
        verify: what named_weights answers (the replica's acknowledged digest): "read_back" reads every tensor back
        from the server; "sent" answers the tensors of the last successful update (SGLang said success), read back
        only for names never updated: cheaper, but it trusts SGLang's load rather than checking it."""
        self.client = client
        self.model_path = Path(model_path)
        self.weight_path: WeightPath = weight_path
        self.verify: Verify = verify
        self._sent: dict[str, torch.Tensor] = {}   # name -> tensor of the last successful update (verify "sent")
        self._specs = held_specs(self.model_path)
        self.routes = moe_shape(self.model_path)    # MoE: record routes (R3), as the torch engine does; else None
        self._server = server
        self._group_host = group_host
        self._own_dir = None if work_dir else tempfile.TemporaryDirectory(prefix="rlfleet-sglang-weights-")
        self._work_dir = Path(work_dir) if work_dir else Path(self._own_dir.name) if self._own_dir else Path()
        self._served_dirs: list[Path] = []
        self._group: object | None = None
        self._group_name = f"rlfleet-{uuid.uuid4().hex[:8]}"
        self._version = weight_version
        self._initial_version = weight_version      # what SGLang calls "default" (no update yet)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="sglang-generate")
        self._lock = threading.Lock()               # in-flight bookkeeping
        self._update_lock = threading.Lock()        # one weight update at a time
        self._in_flight: dict[str, Future[Generation]] = {}
        self._started: set[str] = set()
        self._paused = False
        self._stopped = False
        self._generated = 0
        self._finished = 0

    # ---- generation -----------------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        check_request(input_ids, sampling)
        rid = uuid.uuid4().hex
        future: Future[Generation] = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            if self._stopped:
                raise EngineError("engine is shut down")
            self._in_flight[rid] = future
        self._pool.submit(self._run, rid, [int(t) for t in input_ids], sampling, future)
        return future

    def _run(self, rid: str, input_ids: list[int], sampling: SamplingParams, future: Future[Generation]) -> None:
        with self._lock:
            self._started.add(rid)
        try:
            body = generate_body(input_ids, sampling, rid, routes=self.routes is not None)
            gen = parse_generate_response(self.client.generate(body), fallback_version=self._initial_version,
                                          routes=self.routes)
        except Exception as exc:  # noqa: BLE001 - the request fails, the engine does not
            self._finish(rid, future, exc=exc if isinstance(exc, EngineError) else EngineError(str(exc)))
            return
        self._finish(rid, future, gen=gen)

    def _finish(self, rid: str, future: Future[Generation], gen: Generation | None = None,
                exc: BaseException | None = None) -> None:
        with self._lock:
            self._in_flight.pop(rid, None)
            self._started.discard(rid)
            self._finished += 1
            if gen is not None:
                self._generated += len(gen.output_ids)
        if future.done():
            return
        if gen is not None:
            future.set_result(gen)
        else:
            future.set_exception(exc or EngineError("generation failed"))

    def pause(self) -> int:
        self.client.pause_generation("in_place")
        self._paused = True
        with self._lock:
            return len(self._in_flight)

    def resume(self) -> None:
        self.client.continue_generation()
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def abort_in_flight(self, wait: float = 10.0) -> int:
        """/abort_request for all; the HTTP answers come back with finish_reason abort (and the tokens so far).
        Requests whose answer has not come back within `wait` seconds are resolved here with no tokens."""
        with self._lock:
            victims = dict(self._in_flight)
        if not victims:
            return 0
        try:
            self.client.abort(abort_all=True)
        except SGLangError as exc:
            log.warning("SGLang abort_request failed: %s", exc)
        for future in victims.values():
            try:
                future.exception(timeout=wait)
            except TimeoutError:
                break
        for rid, future in victims.items():
            if not future.done():
                self._finish(rid, future, gen=Generation(output_ids=(), logprobs=(), finish_reason="abort",
                                                         weight_version=self._version))
        return len(victims)

    def stats(self) -> EngineStats:
        with self._lock:
            running = len(self._started)
            return EngineStats(running=running, waiting=len(self._in_flight) - running,
                               generated_tokens=self._generated, finished=self._finished)

    def healthy(self, timeout: float = 3.0) -> bool:
        """The server process (when this engine owns it) is alive and answers /health within `timeout` seconds:
        a dead server refuses at once, a frozen one (SIGSTOP, a wedged scheduler) times out."""
        if self._stopped or (self._server is not None and not self._server.alive()):
            return False
        return self.client.healthy(timeout=timeout)

    # ---- weights ------------------------------------------------------------------------------------------------

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        check_update(self._specs, named_tensors)        # all-or-nothing: refuse before the server sees anything
        with self._update_session(version) as flush:
            if self.weight_path == "distributed":
                self._load_distributed(named_tensors, version, flush)
            else:
                self._load_from_disk(named_tensors, version, flush)
        self._sent.update((n, t.detach()) for n, t in named_tensors)   # references: the transport's fresh buffers
        log.info("sglang engine now serves weight version %d (%d tensors, %s)", version, len(named_tensors),
                 self.weight_path)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        """A safetensors folder the server can read (same filesystem): loaded as is."""
        with self._update_session(version) as flush:
            self.client.update_weights_from_disk(str(path), str(version), flush_cache=flush)
        self._sent.clear()                              # not sent by us: named_weights reads it back

    @contextmanager
    def _update_session(self, version: int) -> Iterator[bool]:
        """One update at a time, inside begin/end_weight_update. With requests in flight, generation is paused in
        place around it (unless already paused) and the cache is not flushed (SGLang refuses a flush while requests
        run); yields whether to flush. The new version is recorded only when the body succeeded."""
        with self._update_lock:
            with self._lock:
                busy = bool(self._in_flight)
            paused_here = busy and not self._paused
            if paused_here:
                self.client.pause_generation("in_place")
            try:
                self.client.begin_weight_update()
                try:
                    yield not busy
                finally:
                    self.client.end_weight_update()
            finally:
                if paused_here:
                    self.client.continue_generation()
            self._version = version

    def _load_from_disk(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, flush: bool) -> None:
        folder = write_weights_folder(self._work_dir, version, named_tensors, self.model_path)
        self.client.update_weights_from_disk(str(folder), str(version), flush_cache=flush)
        self._served_dirs = [*self._served_dirs[-1:], folder]
        prune_weights_folders(self._work_dir, keep=self._served_dirs)

    def _load_distributed(self, named_tensors: list[tuple[str, torch.Tensor]], version: int, flush: bool) -> None:
        if self._group is None:
            port = free_port(self._group_host)
            holder: list[object] = []
            run_beside(lambda: self.client.init_weights_update_group(self._group_host, port, 1, 2, self._group_name),
                       lambda: holder.append(new_group(self._group_host, port, 2, 0, self._group_name)),
                       timeout=self.client.weight_timeout)
            self._group = holder[0]
        names = [n for n, _ in named_tensors]
        dtypes = [str(t.dtype).removeprefix("torch.") for _, t in named_tensors]
        shapes = [list(t.shape) for _, t in named_tensors]
        try:
            run_beside(lambda: self.client.update_weights_from_distributed(names, dtypes, shapes, self._group_name,
                                                                           str(version), flush_cache=flush),
                       lambda: broadcast_tensors(self._group, [t for _, t in named_tensors]),
                       timeout=self.client.weight_timeout)
        except Exception:
            self._drop_group()                          # a half-done collective leaves the group unusable
            raise

    def _drop_group(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        try:
            self.client.destroy_weights_update_group(self._group_name)
        except SGLangError as exc:
            log.info("destroy_weights_update_group: %s", exc)
        self._group_name = f"rlfleet-{uuid.uuid4().hex[:8]}"

    def tied_aliases(self) -> None:
        """The server's module is out of reach: it loaded the same HF config as the trainer, so it ties the same."""
        return None

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """What the server serves now, by HF name: read back (verify "read_back"), or as last sent ("sent")."""
        if self.verify == "read_back":
            return [(name, read_back(self.client, name, spec)) for name, spec in self._specs.items()]
        for name, spec in self._specs.items():
            if name not in self._sent:
                self._sent[name] = read_back(self.client, name, spec)
        return [(name, self._sent[name]) for name in self._specs]

    # ---- lifecycle ----------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
        answers = (self._server is None or self._server.alive()) and self.client.healthy(timeout=2.0)
        if answers:                       # a frozen or dead server is not asked anything on the way out
            self.abort_in_flight(wait=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if answers:
            self._drop_group()
        if self._server is not None:
            self._server.stop()
        if self._own_dir is not None:
            self._own_dir.cleanup()
