"""The built-in engine: any HF causal LM from a local folder, continuous batching with a KV cache, on CPU or GPU.

One scheduler thread owns the model. Each iteration it admits waiting requests (up to max_batch_size running
sequences) with a left-padded prefill whose cache is merged into the running batch, then runs one decode step for
every running sequence. A request finishes on EOS, one of its stop ids, or max_new_tokens, and its future resolves
at once while the others keep going. Weight updates land between two decode steps, and in-flight sequences continue
under the new weights (each token records the version that produced it). The forwards themselves run through a
Decoder (decoder.py) chosen once when the model loads: the lean Llama-family path (lean_llama/) or the HF modules
(hf_decoder.py).

The scheduler thread also loads the model and does every other piece of tensor work on it (weight loads, freeing
rows on abort, `call`): other threads only hand it work. On CPU this is worth ~1.7x at two or more torch threads.
libgomp keeps one OpenMP team per thread that ever ran a parallel op, and once the teams' threads outnumber the
CPUs it stops spinning between parallel regions (100 spins instead of ~300k), so every op then pays a futex wake-up:
a SmolLM2-135M decode step measured 143 ms when the loading thread's team was the process's only one and 230 ms
when the loading (main) thread kept its team beside the engine's. Callers in the same process should likewise keep
their torch work off long-lived threads, or hand it to `call`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from rlfleet.cpu_kernels import batch_invariant, load_kwargs
from rlfleet.model_specs import ModuleSpec, apply_specs
from rlfleet.protocols import Generation, SamplingParams
from rlfleet.runtime.torch_profile import VersionProfiler
from rlfleet.services.rollout.engines import kv_cache, lean_llama
from rlfleet.services.rollout.engines.base import (
    Abortable,
    EngineError,
    EngineStats,
    HoldsAdmission,
    Pausable,
    ProfilesDecode,
    Retractable,
    Streaming,
    TensorThread,
    check_request,
)
from rlfleet.services.rollout.engines.decoder import Decoder
from rlfleet.services.rollout.engines.hf_decoder import HFDecoder
from rlfleet.services.rollout.engines.moe_routes import RouteRecorder
from rlfleet.services.rollout.engines.sampling import RowSampling, choose_tokens
from rlfleet.services.rollout.engines.weights import check_update, load_safetensors_folder
from rlfleet.weights.tied import tied_aliases as module_ties

log = logging.getLogger(__name__)

T = TypeVar("T")
SETTLE_GAP_S = 0.001          # an idle engine admits once no request came for this long (`_settle`) ...
SETTLE_MAX_S = 0.01           # ... or this long after it woke
TokenCallback = Callable[[int, float], None]      # (token id, logprob) of each output token as it is chosen
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Request:
    input_ids: list[int]
    sampling: SamplingParams
    future: Future[Generation]
    row: RowSampling
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    seed: int | None = None          # the sampling stream's seed: a retracted request restarts it
    routes: list[np.ndarray] = field(default_factory=list)     # MoE: [layers, K] expert ids per output token
    on_token: TokenCallback | None = None                          # streaming: told each output token as chosen


def _eos_ids(model: torch.nn.Module) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    return frozenset(ids)


def _no_label(name: str) -> AbstractContextManager[object]:
    return nullcontext()


def _decoder_for(model: torch.nn.Module, device: torch.device, lean: bool, compile: bool, onednn: bool,
                 native_attention: bool) -> Decoder:
    """The lean Llama-family decoder where asked for (lean: fast_decode and not on-policy), the model has no MoE
    routes to record and lean_llama supports it; else the HF modules' forward (recording routes for an MoE model)."""
    routes = RouteRecorder.attach(model)                 # MoE models: record routes for R3, else None
    if lean and routes is None and lean_llama.supports(model):
        return lean_llama.FastDecoder(model, compile=compile, onednn=onednn, native_attention=native_attention)
    return HFDecoder(model, device, routes)


class TorchEngine(Pausable, Abortable, Streaming, Retractable, TensorThread, HoldsAdmission, ProfilesDecode):
    name = "torch"

    def __init__(self, model_path: str | Path, max_batch_size: int = 64, device: str = "cpu",
                 dtype: str | None = None, seed: int = 0, eos_token_ids: Iterable[int] | None = None,
                 weight_version: int = 0, on_policy: bool = False, fast_decode: bool = True,
                 compile: bool = False, onednn: bool = True, native_attention: bool = True,
                 model_specs: Sequence[ModuleSpec] = ()) -> None:
        """dtype None: the dtype in the folder's config. eos_token_ids None: from the model's generation config.
        on_policy: true on-policy mode (trainer.on_policy): eager attention and every step inside
        rlfleet.cpu_kernels.invariant_ops, so the logprobs equal the trainer's recomputation bitwise (no fast or
        compiled decode). fast_decode: Llama-family models decode through `lean_llama.FastDecoder` (same math, less
        overhead), other models through the HF modules (hf_decoder.HFDecoder); compile: torch.compile the lean
        layer step (off by default; an uncompiled engine never compiles); onednn: that step's linears through oneDNN
        on a CPU (lean_llama/llama_ops.py), else torch's ops; native_attention: that step's attention through a C
        kernel on a CPU with AVX-512 (lean_llama/native_attention.py). model_specs: model.specs, applied to the
        loaded model by the trainer's code (rlfleet/model_specs/); the lean path is then not taken (it computes
        from the HF modules' weights, not through the modules), the HF modules' forward runs the replacements."""
        self.model_specs = tuple(model_specs)
        self.on_policy = on_policy
        self.model: torch.nn.Module
        self.vocab_size: int
        self.eos_ids: frozenset[int]
        self._decoder: Decoder                      # chosen once when the model loads (_decoder_for)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self._seeds = torch.Generator().manual_seed(seed)       # seeds requests that bring none
        self._version = weight_version
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)   # [B, L]
        self._pos = torch.zeros(0, dtype=torch.long, device=self.device)       # [B] next position id
        self._last = torch.zeros(0, dtype=torch.long, device=self.device)      # [B] sampled, not yet in the cache
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._tasks: deque[tuple[Callable[[], Any], Future[Any]]] = deque()   # work for the engine thread
        self._paused = False
        self._holds = 0                              # admission_held() calls in progress
        self._stopped = False
        self._generated = 0
        self._finished = 0
        self._profiler: VersionProfiler | None = None      # trainer.profile: traces steps of chosen versions
        loaded: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name="torch-engine", daemon=True,
                                        args=(loaded, str(model_path), dtype, eos_token_ids,
                                              fast_decode and not on_policy, compile, onednn, native_attention))
        self._thread.start()
        loaded.result()                  # the model is loaded (on the engine thread), or its EngineError is raised

    def _load(self, model_path: str, dtype: str | None, eos_token_ids: Iterable[int] | None, fast_decode: bool,
              compile: bool, onednn: bool, native_attention: bool) -> None:
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=DTYPES[dtype] if dtype else "auto", use_safetensors=True,
                **load_kwargs(self.on_policy)).to(self.device)
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load a causal LM from {model_path}: {exc}") from exc
        if apply_specs(self.model, self.model_specs) and fast_decode:
            log.info("model.specs replace modules: the torch engine decodes through the HF modules' forward, not the "
                     "lean Llama path")
            fast_decode = False
        self.model.eval()
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.eos_ids = frozenset(eos_token_ids) if eos_token_ids is not None else _eos_ids(self.model)
        self._decoder = _decoder_for(self.model, self.device, fast_decode, compile, onednn, native_attention)

    def _run(self, loaded: Future[None], *load_args: Any) -> None:
        try:
            self._load(*load_args)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor, which raises it
            loaded.set_exception(exc)
            return
        loaded.set_result(None)
        self._loop()

    # ---- public API -------------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        return self.submit_streaming(input_ids, sampling, None)

    def submit_streaming(self, input_ids: Sequence[int], sampling: SamplingParams,
                         on_token: TokenCallback | None) -> Future[Generation]:
        """submit, and call on_token(id, logprob) on the engine thread as each output token is chosen (keep it cheap:
        put it on a queue). The calls are the future's output ids and logprobs, in order."""
        check_request(input_ids, sampling)
        bad = [t for t in input_ids if not 0 <= int(t) < self.vocab_size]
        if bad:                                      # refused here: inside a batch it would fail every request
            raise EngineError(f"token id {bad[0]} outside the vocabulary (size {self.vocab_size})")
        future: Future[Generation] = Future()
        future.set_running_or_notify_cancel()
        with self._cv:
            if self._stopped:
                raise EngineError("engine is shut down")
            seed = sampling.seed if sampling.seed is not None else int(
                torch.randint(0, 2**62, (1,), generator=self._seeds))
            rng = np.random.default_rng(seed) if sampling.temperature > 0 else None
            row = RowSampling(sampling.temperature, sampling.top_p, sampling.top_k, rng)
            self._waiting.append(_Request([int(t) for t in input_ids], sampling, future, row,
                                          self.eos_ids | frozenset(sampling.stop_token_ids), seed=seed,
                                          on_token=on_token))
            self._cv.notify_all()
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread between two steps (paused or not) and return its result or raise its error:
        for tensor work on the model from another thread (see the module doc for why)."""
        if threading.current_thread() is self._thread:
            return fn()
        done: Future[T] = Future()
        with self._cv:
            if self._stopped:
                raise EngineError("engine is shut down")
            self._tasks.append((fn, done))
            self._cv.notify_all()
        return done.result()

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        params = dict(self.model.state_dict())
        check_update(params, named_tensors)          # all-or-nothing: refuse before touching anything

        def load() -> None:
            with torch.no_grad():
                for name, tensor in named_tensors:
                    params[name].copy_(tensor.to(self.device))
            self._version = version

        self.call(load)
        log.info("torch engine now serves weight version %d (%d tensors)", version, len(named_tensors))

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self.update_weights_from_tensor(load_safetensors_folder(Path(path)), version)

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return list(self.model.state_dict().items())

    def tied_aliases(self) -> dict[str, str]:
        return module_ties(self.model)

    def profile_decode(self, profiler: VersionProfiler) -> None:
        """Trace the engine steps run under profiler's weight versions (set on the engine thread, which runs them)."""
        def attach() -> None:
            self._profiler = profiler
        self.call(attach)

    @contextmanager
    def admission_held(self) -> Iterator[None]:
        """Requests submitted inside are admitted together when the outermost hold ends: a burst (a Claim's groups)
        becomes one packed prefill however long submitting it takes, where admission as they came prefilled the
        first few after the settle window and merged the rest in one by one. Running rows keep decoding."""
        with self._cv:
            self._holds += 1
        try:
            yield
        finally:
            with self._cv:
                self._holds -= 1
                self._cv.notify_all()

    def pause(self) -> int:
        with self._cv:
            self._paused = True
        with self._step_lock:                        # the step in progress, if any, has ended
            return len(self._running) + len(self._waiting)

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def abort_in_flight(self) -> int:
        with self._step_lock:
            with self._cv:
                victims = list(self._running) + list(self._waiting)
                self._waiting.clear()
            self._running = []
            self._cache = None
            self._mask = self._mask[:0, :0]
            self._pos, self._last = self._pos[:0], self._last[:0]
        for req in victims:
            self._resolve(req, "abort")
        return len(victims)

    def retract_in_flight(self) -> int:
        """Partial rollouts, retract mode: every running request goes back to the front of the queue with its output
        dropped and its KV rows freed; it is generated again from its prompt (same seed) under the weights loaded
        when it is admitted. Futures stay pending. Call while paused, before a weight update. Returns how many."""
        with self._step_lock:
            victims = self._running
            self._running, self._cache = [], None
            self._mask = self._mask[:0, :0]
            self._pos, self._last = self._pos[:0], self._last[:0]
            with self._cv:
                for req in reversed(victims):
                    for part in (req.output_ids, req.logprobs, req.versions, req.routes):
                        part.clear()
                    if req.row.rng is not None:
                        req.row = dataclasses.replace(req.row, rng=np.random.default_rng(req.seed))
                    self._waiting.appendleft(req)
                self._cv.notify_all()
        return len(victims)

    def abort(self, futures: Iterable[Future[Generation]]) -> int:
        """Resolve these requests now with finish_reason 'abort' (over-sampled work no longer needed), freeing their
        batch slots and KV rows; the other requests continue. Returns how many were still in the engine."""
        targets = {id(f) for f in futures}

        def drop() -> list[_Request]:
            with self._cv:
                victims = [r for r in self._waiting if id(r.future) in targets]
                self._waiting = deque(r for r in self._waiting if id(r.future) not in targets)
            keep = [i for i, r in enumerate(self._running) if id(r.future) not in targets]
            victims += [r for r in self._running if id(r.future) in targets]
            if len(keep) < len(self._running):
                self._keep_rows(keep)
            return victims

        try:
            victims = self.call(drop)
        except EngineError:                           # shut down: everything was resolved already
            return 0
        for req in victims:
            self._resolve(req, "abort")
        return len(victims)

    def _keep_rows(self, keep: list[int]) -> None:
        """Keep only the running requests at batch rows `keep` (in order), with their KV rows; free the rest."""
        self._running = [self._running[i] for i in keep]
        if keep:
            idx = torch.tensor(keep, dtype=torch.long, device=self.device)
            assert self._cache is not None
            self._mask = self._decoder.select(self._cache, self._mask, idx)
            self._pos, self._last = self._pos[idx], self._last[idx]
        else:
            self._cache = None
            self._mask = self._mask[:0, :0]
            self._pos, self._last = self._pos[:0], self._last[:0]

    def kv_tokens(self) -> int:
        """KV positions held for the running batch (rows x length): 0 when nothing runs, i.e. nothing leaked."""
        return int(self._mask.numel()) if self._cache is not None else 0

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._running), waiting=len(self._waiting), generated_tokens=self._generated,
                           finished=self._finished)

    def healthy(self) -> bool:
        """The decode loop thread is alive and the engine is not shut down."""
        return self._thread.is_alive() and not self._stopped

    def shutdown(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        self.abort_in_flight()
        with self._cv:
            tasks, self._tasks = list(self._tasks), deque()
        for _, done in tasks:                        # handed in after the loop's last look
            done.set_exception(EngineError("engine is shut down"))

    # ---- scheduler --------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and not self._tasks and \
                        (self._paused or not ((self._waiting and not self._holds) or self._running)):
                    self._cv.wait()
                if self._stopped:
                    tasks, self._tasks = list(self._tasks), deque()
                    for _, done in tasks:
                        done.set_exception(EngineError("engine is shut down"))
                    if self._profiler is not None:       # an open trace is written on the thread that ran it
                        self._profiler.close()
                    return
                tasks, self._tasks = list(self._tasks), deque()
            with self._step_lock:
                for fn, done in tasks:
                    try:
                        done.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - the caller of `call` gets it
                        done.set_exception(exc)
                with self._cv:
                    if self._paused or self._stopped:    # pause() came between the check above and the lock
                        continue
                    if self._waiting and not self._running and not self._holds:
                        self._settle()
                    room = 0 if self._holds else self.max_batch_size - len(self._running)
                    admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                try:
                    self._step(admitted)
                except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                    log.exception("torch engine step failed")
                    self._fail_all(exc, admitted)

    def _settle(self) -> None:
        """An idle engine about to admit (called with _cv held): wait while submissions keep coming, each within
        SETTLE_GAP_S of the one before and SETTLE_MAX_S in all, so a burst (a group's samples, a batch) is prefilled
        as one: one packed prefill instead of several plus merges, and a group's prompt once. A running engine needs
        none: what arrives during a step is admitted together at the next."""
        deadline = time.monotonic() + SETTLE_MAX_S
        seen = len(self._waiting)
        while seen < self.max_batch_size and not (self._stopped or self._paused or self._tasks):
            left = deadline - time.monotonic()
            if left <= 0 or not self._cv.wait(min(SETTLE_GAP_S, left)) or len(self._waiting) == seen:
                return
            seen = len(self._waiting)

    def _step(self, admitted: list[_Request]) -> None:
        profiler = self._profiler
        if profiler is not None:
            profiler.before_step(self._version)
        label = profiler.label if profiler is not None else _no_label
        with torch.inference_mode(), batch_invariant(self.on_policy):
            if admitted:
                with label("rlfleet.engine.prefill"):
                    self._prefill(admitted)
            if self._running:
                with label("rlfleet.engine.decode"):
                    self._decode()

    def _prefill(self, reqs: list[_Request]) -> None:
        """Prefill the admitted requests. Equal prompts (a group's samples) are prefilled once and their cache rows
        copied: a GRPO group of 8 costs one prompt's prefill, not 8."""
        unique: dict[tuple[int, ...], int] = {}
        of_row = [unique.setdefault(tuple(r.input_ids), len(unique)) for r in reqs]           # [N] -> unique row
        rows = torch.tensor(of_row, dtype=torch.long, device=self.device)                   # [N]
        out = self._decoder.prefill(list(unique), rows, self._still_to_add(reqs))
        self._admit(reqs, out.cache, out.mask)
        self._accept(out.logits, first=len(self._running) - len(reqs), routes=out.routes)

    def _admit(self, reqs: list[_Request], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Add prefilled requests (their cache and mask [N, P]) to the running batch, after the running rows."""
        if self._cache is None or not self._running:
            self._cache, self._mask = cache, mask
            self._pos, self._last = mask.sum(1), torch.zeros(len(reqs), dtype=torch.long, device=self.device)
            self._running = list(reqs)
        else:
            self._cache, self._mask = kv_cache.merge(self._cache, self._mask, cache, mask)
            self._pos = torch.cat([self._pos, mask.sum(1)])
            self._last = torch.cat([self._last, torch.zeros(len(reqs), dtype=torch.long, device=self.device)])
            self._running = self._running + list(reqs)

    def _decode(self) -> None:
        b = len(self._running)
        self._mask = torch.cat([self._mask, self._mask.new_ones(b, 1)], dim=1)  # [B, L+1]
        out = self._decoder.decode(self._cache, self._last, self._pos, self._mask, self._still_to_add(self._running))
        self._cache = out.cache
        self._pos = self._pos + 1
        self._accept(out.logits, first=0, routes=out.routes)                    # logits: [B, V]

    @staticmethod
    def _still_to_add(reqs: Sequence[_Request]) -> int:
        """The most tokens any of reqs may still add (each adds one a step), at least 1: how many spare cache
        columns a decoder that keeps some may allocate."""
        return max(1, max((r.sampling.max_new_tokens - len(r.output_ids) for r in reqs), default=1))

    def _accept(self, logits: torch.Tensor, first: int, routes: torch.Tensor | None = None) -> None:
        """logits: [R, V] for running rows first..first+R-1. Choose tokens, finish requests, drop their rows.

        routes: [R, layers, K] expert ids of the forward that produced these logits (MoE models), else None.
        """
        rows = self._running[first:]
        tokens, logprobs = choose_tokens(logits, [r.row for r in rows], exact_logprobs=self.on_policy)   # [R], [R]
        self._last[first:] = tokens
        version = self._version
        done: list[tuple[int, str]] = []
        for i, (req, tok, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            req.output_ids.append(tok)
            req.logprobs.append(lp)
            req.versions.append(version)
            if routes is not None:
                req.routes.append(routes[i].numpy())
            if req.on_token is not None:
                try:
                    req.on_token(tok, lp)
                except Exception:  # noqa: BLE001 - a listener's failure never stops the batch
                    log.exception("streaming callback failed; the request goes on without it")
                    req.on_token = None
            if tok in req.stop_ids:
                done.append((first + i, "stop"))
            elif len(req.output_ids) >= req.sampling.max_new_tokens:
                done.append((first + i, "length"))
        self._generated += len(rows)
        if not done:
            return
        finished = {i for i, _ in done}
        keep = [i for i in range(len(self._running)) if i not in finished]
        resolved = [(self._running[i], reason) for i, reason in done]
        self._keep_rows(keep)
        for req, reason in resolved:
            self._resolve(req, reason)

    def _resolve(self, req: _Request, reason: str) -> None:
        self._finished += 1
        if req.future.done():
            return
        req.future.set_result(Generation(
            output_ids=tuple(req.output_ids), logprobs=tuple(req.logprobs), finish_reason=reason,
            weight_version=req.versions[0] if req.versions else self._version, token_versions=tuple(req.versions),
            routed_experts=np.stack(req.routes) if req.routes else None))       # [T, layers, K]

    def _fail_all(self, exc: Exception, admitted: list[_Request]) -> None:
        victims, self._running, self._cache = self._running + admitted, [], None
        self._mask = self._mask[:0, :0]
        self._pos, self._last = self._pos[:0], self._last[:0]
        for req in victims:
            if not req.future.done():
                req.future.set_exception(EngineError(f"generation failed: {type(exc).__name__}: {exc}"))
