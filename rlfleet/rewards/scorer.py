"""Call a reward function the way every rlfleet service does: with the dataset's extra columns as keyword arguments
(as TRL does), under a time-out, sync or async, one sample at a time or batched.

A reward that raises, hangs past the time-out or returns a non-finite value raises RewardFailure with the reason;
the caller marks that sample FAILED and goes on. Sync rewards run on a pool of daemon threads (started as needed,
reused: no thread start per sample). A sync reward that hangs keeps its thread: Python cannot stop it, but nothing
waits on it, the pool starts another for the next call, and a daemon thread never holds up the process's exit.
Several samples scored together (`score_batch` of a plain reward) are one job on one pool thread, each call with the
time-out to itself: one hand-off instead of one per sample. A hand-off is two GIL acquisitions by other threads,
which in a rollout replica whose engine thread runs Python between its ops cost up to a switch interval (5 ms) each:
measured 24 us per sample alone, 7.5 ms beside a busy Python thread.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlfleet.protocols import Prompt, RewardFn, reward_total

RESERVED = ("prompt", "completion", "sample", "prompts", "completions", "samples")


class RewardFailure(RuntimeError):
    """The reward could not score a sample; str() is the reason recorded on the sample."""


def batched(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark fn(prompts, completions, samples, **columns) -> list of rewards as batched: it is called once per group
    (columns are lists, one value per sample)."""
    fn.rlfleet_batched = True  # type: ignore[attr-defined]
    return fn


def _accepted(fn: Callable[..., Any]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Which extra columns fn takes: all of them with **kwargs, else those named as parameters."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return lambda extras: {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return lambda extras: {k: v for k, v in extras.items() if k not in RESERVED}
    names = {p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)} - set(RESERVED)
    return lambda extras: {k: v for k, v in extras.items() if k in names}


class _AsyncLoop:
    """One event loop in a daemon thread for async rewards."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="reward-loop", daemon=True).start()


class _DaemonPool:
    """Runs jobs on reusable daemon threads; a job that never returns keeps its thread, and the next job gets another.
    (concurrent.futures threads are joined at interpreter exit, so a hung reward would hang the replica's exit.)"""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0                  # threads that will take the next job without one assigned
        self._lock = threading.Lock()

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        if start:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


class _SequentialJob:
    """Calls of fn run one after another on a pool thread; the caller reads each result with a time-out of its own.
    Once a read times out the job is abandoned: the call in progress may still end, but no further one starts."""

    def __init__(self, fn: Callable[..., Any], calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
        self.fn, self.calls = fn, calls
        self._results: list[tuple[bool, Any]] = []          # (returned, value or exception), in call order
        self._cond = threading.Condition()
        self._abandoned = False

    def __call__(self) -> None:
        for args, kwargs in self.calls:
            try:
                result: tuple[bool, Any] = (True, self.fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - user code
                result = (False, exc)
            with self._cond:
                if self._abandoned:
                    return
                self._results.append(result)
                self._cond.notify()

    def result(self, i: int, timeout: float) -> tuple[bool, Any] | None:
        """(returned, value or exception) of call i once it ended, or None (and the job abandoned) after timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._results) > i, timeout):
                self._abandoned = True
                return None
            return self._results[i]


class Scorer:
    def __init__(self, fn: Callable[..., Any], timeout: float, name: str = "reward_fn") -> None:
        self.fn, self.timeout, self.name = fn, timeout, name
        self.batched = bool(getattr(fn, "rlfleet_batched", False))
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._extras = _accepted(fn)
        self._loop: _AsyncLoop | None = None
        self._pool = _DaemonPool("reward")

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) within the time-out; raises RewardFailure."""
        value = self._call_each([(args, kwargs)])[0]
        if isinstance(value, RewardFailure):
            raise value
        return value

    def _call_each(self, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        """fn(*args, **kwargs) of each call, in order: the values, a RewardFailure in the place of each call that
        raised or timed out (see _start)."""
        return self._start(calls)()

    def _start(self, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> Callable[[], list[Any]]:
        """Start the calls; returns the function that waits for their values (as _call_each returns them). A sync
        reward runs them as one job on one pool thread, each call with the time-out to itself (from when the one
        before it returned); after a call that times out, its job is abandoned (it starts no further call) and the
        calls after it go to another thread. An async reward has every call in flight on its loop at once, each
        waited for up to the time-out."""
        if self.is_async:
            if self._loop is None:
                self._loop = _AsyncLoop()
            loop = self._loop.loop
            running = [asyncio.run_coroutine_threadsafe(self.fn(*args, **kwargs), loop) for args, kwargs in calls]
            return lambda: [self._await(f) for f in running]
        job = _SequentialJob(self.fn, calls)
        self._pool.run(job)
        return lambda: self._collect(job, calls)

    def _await(self, future: Any) -> Any:
        try:
            return future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            return RewardFailure(f"{self.name} timed out after {self.timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - user code
            return RewardFailure(f"{self.name} raised {type(exc).__name__}: {exc}")

    def _collect(self, job: _SequentialJob, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        out: list[Any] = []
        while True:
            for i in range(len(job.calls)):
                result = job.result(i, self.timeout)
                if result is None:
                    out.append(RewardFailure(f"{self.name} timed out after {self.timeout:g}s"))
                    break
                ok, value = result
                out.append(value if ok else RewardFailure(f"{self.name} raised {type(value).__name__}: {value}"))
            if len(out) == len(calls):
                return out
            job = _SequentialJob(self.fn, calls[len(out):])
            self._pool.run(job)

    def _fold_or_failure(self, value: Any) -> tuple[float, dict[str, float]] | RewardFailure:
        try:
            return self._fold(value)
        except RewardFailure as exc:
            return exc

    @staticmethod
    def _fold(value: Any) -> tuple[float, dict[str, float]]:
        try:
            reward, parts = reward_total(value)
        except (TypeError, ValueError, KeyError) as exc:
            raise RewardFailure(f"reward is not a number or a mapping of numbers: {value!r:.80} ({exc})") from None
        if not math.isfinite(reward) or not all(math.isfinite(v) for v in parts.values()):
            raise RewardFailure(f"reward is not finite: {value!r:.80}")
        return reward, parts

    def score(self, prompt: Prompt, completion: str, sample: Any) -> tuple[float, dict[str, float]]:
        """(reward, parts) of one sample; raises RewardFailure."""
        if self.batched:
            result = self.score_batch([prompt], [completion], [sample])[0]
            if isinstance(result, RewardFailure):
                raise result
            return result
        return self._fold(self._call(prompt, completion, sample, **self._extras(prompt.extras)))

    def score_batch(self, prompts: Sequence[Prompt], completions: Sequence[str],
                    samples: Sequence[Any]) -> list[tuple[float, dict[str, float]] | RewardFailure]:
        """One result per sample: (reward, parts), or the RewardFailure of that sample."""
        return self._start_batch(prompts, completions, samples)()

    def score_batches(self, batches: Sequence[tuple[Sequence[Prompt], Sequence[str], Sequence[Any]]]
                      ) -> list[list[tuple[float, dict[str, float]] | RewardFailure]]:
        """score_batch of each (prompts, completions, samples), every batch started before any is waited for: a
        batch is one job of its own (a batched reward: one call per batch), so a slow or remote reward overlaps
        across groups as it did with a thread per group."""
        waits = [self._start_batch(*batch) for batch in batches]
        return [wait() for wait in waits]

    def _start_batch(self, prompts: Sequence[Prompt], completions: Sequence[str], samples: Sequence[Any]
                     ) -> Callable[[], list[tuple[float, dict[str, float]] | RewardFailure]]:
        if not self.batched:
            wait = self._start([((p, c, s), self._extras(p.extras))
                                for p, c, s in zip(prompts, completions, samples, strict=True)])
            return lambda: [v if isinstance(v, RewardFailure) else self._fold_or_failure(v) for v in wait()]
        columns = {k: [p.extras.get(k) for p in prompts] for k in self._extras(prompts[0].extras if prompts else {})}
        wait_one = self._start([((list(prompts), list(completions), list(samples)), columns)])
        return lambda: self._unbatch(wait_one()[0], len(samples))

    def _unbatch(self, values: Any, n: int) -> list[tuple[float, dict[str, float]] | RewardFailure]:
        """A batched reward's return value as one result per sample."""
        if isinstance(values, RewardFailure):
            return [values] * n
        if not isinstance(values, Sequence) or len(values) != n:
            failure = RewardFailure(f"{self.name} (batched) returned {type(values).__name__} "
                                    f"{'of length ' + str(len(values)) if isinstance(values, Sequence) else ''} "
                                    f"for {n} samples")
            return [failure] * n
        return [self._fold_or_failure(v) for v in values]


def resolve_reward(name: str, args: Mapping[str, Any], what: str = "reward_fn") -> Callable[..., Any]:
    """A stock reward name with its options, or a dotted path (a factory called with args when args are given)."""
    from rlfleet.plugins import PluginError, check_signature, import_attr, load_factory
    from rlfleet.rewards.stock import STOCK

    if ":" not in name:
        if name not in STOCK:
            raise PluginError(f"{what} '{name}': unknown reward (stock rewards: {', '.join(sorted(STOCK))}; or "
                              "give a dotted path 'package.module:function')")
        factory = STOCK[name]
        try:
            inspect.signature(factory).bind(**args)
        except TypeError:
            raise PluginError(f"{what} '{name}': options {sorted(args)} do not fit {name}{inspect.signature(factory)}"
                              ) from None
        try:
            return factory(**args)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"{what} '{name}': bad options {dict(args)}: {type(exc).__name__}: {exc}") from None
    if args:
        fn = load_factory(name, what, dict(args))
        if not callable(fn):
            raise PluginError(f"{what} '{name}': factory returned {type(fn).__name__}, which is not callable")
    else:
        fn = import_attr(name, what)
        if not callable(fn):
            raise PluginError(f"{what} '{name}': {type(fn).__name__} is not callable")
    # RewardFn's positional parameters; the function's further required ones are dataset columns, by keyword
    check_signature(fn, RewardFn, what, name, columns_as_keywords=True)
    return fn


def load_scorer(name: str, args: Mapping[str, Any], timeout: float, what: str = "reward_fn") -> Scorer:
    return Scorer(resolve_reward(name, args, what), timeout, name=what)
