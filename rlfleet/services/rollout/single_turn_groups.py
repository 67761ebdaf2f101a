"""The built-in `single_turn` rollout for every group of a replica on one collector thread, not a thread per group.

With a thread per group, a step of 32 groups is 32 threads that each wake when their completions finish, hand their
samples to a reward thread and wait for it, serialize, and queue for a Put: several hundred GIL hand-offs a step
beside the engine thread, which runs Python between its ops. Measured on the addition example (32 groups x 8, in
one process with the engine): ~120 ms of CPU a round with a thread per group, ~100 ms with this collector, ~88 ms for
the engine alone.

Here a group starts on the caller's thread (the work loop's claim thread): its prompt is read and encoded and its
group_size engine requests are submitted exactly as `single_turn` submits them (`group_samples.submit_group`: the same
per-sample seeds, so the same samples). Each request's done-callback (run on the engine's thread) counts its group
down, and the last one queues the group, whole. The collector takes every group queued by then, builds their samples
(`group_samples.sample_of`), scores them (`ServiceContext.score_groups`: one reward job per group, all started before
any is waited for, so a slow or remote reward still overlaps across groups) and hands them to `finish` together (the
work loop puts them in one shared Put). A group that cannot start (its prompt or encoding raised, or the engine
refused a request) is handed to `finish` with the reason and no samples.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from rlfleet.protocols import DataSource, Generation, GroupTicket
from rlfleet.sample import Sample
from rlfleet.services.rollout.context import GroupAborted, GroupContext
from rlfleet.services.rollout.group_collector import FinishGroups, GroupCollector, StartedGroup
from rlfleet.services.rollout.group_samples import (
    greedy_sample,
    sample_of,
    set_baseline,
    submit_greedy,
    submit_group,
    wants_baseline,
)

log = logging.getLogger(__name__)


class _Countdown:
    """The done-callback of each of a group's requests: the last one queues the group and lets go of it.

    The futures keep their callbacks, and the group keeps its futures; if the callback kept the group too, every
    finished group (its futures, generations and samples: ~170 objects a group of 8) would be a reference cycle that
    only a full garbage collection frees, and a replica on the addition example made ~35k such objects a second.
    Let go, they are freed by reference counting once the work loop has put the group."""

    def __init__(self, group: StartedGroup, left: int, ready: queue.SimpleQueue[StartedGroup | None]) -> None:
        self._group: StartedGroup | None = group
        self._left, self._ready = left, ready
        self._lock = threading.Lock()

    def __call__(self, _: Future[Generation]) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
            group, self._group = self._group, None
        if group is not None:
            self._ready.put(group)


class SingleTurnGroups(GroupCollector):
    """start(ticket, gctx, done) on any thread; finish(groups) is called on the collector thread with each batch of
    groups that completed by the time it woke, samples scored; close() ends the collector after what is queued."""

    def __init__(self, ctx: Any, data: DataSource, finish: FinishGroups) -> None:
        self._ctx, self._data, self._finish = ctx, data, finish
        self._queue: queue.SimpleQueue[StartedGroup | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._collect, name="collector", daemon=True)
        self._thread.start()

    def start(self, ticket: GroupTicket, gctx: GroupContext, done: Future[None]) -> None:
        group = StartedGroup(ticket, gctx, done)
        try:
            group.prompt = self._data[ticket.prompt_index]
            group.prompt_ids = gctx.encode_prompt(group.prompt)
            group.requests = submit_group(gctx, group.prompt_ids, ticket)
            group.greedy = submit_greedy(gctx, group.prompt_ids) if wants_baseline(gctx) else None
        except Exception as exc:  # noqa: BLE001 - a group that cannot start fails alone
            group.aborted = isinstance(exc, GroupAborted)
            gctx.abort()                    # the requests it did submit
            group.error = f"rollout_fn raised {type(exc).__name__}: {exc}"
            self._queue.put(group)
            return
        requests = group.requests + ([group.greedy] if group.greedy is not None else [])
        countdown = _Countdown(group, len(requests), self._queue)
        for request in requests:
            request.add_done_callback(countdown)

    def close(self) -> None:
        self._queue.put(None)

    def _collect(self) -> None:
        while self._collect_batch(self._queue.get()):
            pass

    def _collect_batch(self, first: StartedGroup | None) -> bool:
        """first and every group that completed meanwhile: built, scored and finished together. Returns whether to
        go on (False once close() was called). Keeps no group once it returns, so a put group is freed at once."""
        if first is None:
            return False
        batch, closing = [first], False
        while True:                    # every group that completed meanwhile goes along
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                closing = True
                break
            batch.append(more)
        try:
            self._build_and_score([g for g in batch if g.error is None])
        except Exception as exc:  # noqa: BLE001 - a bug here fails these groups, never the collector
            log.exception("collector: building or scoring %d groups failed", len(batch))
            for g in batch:
                g.samples, g.error = [], g.error or f"collector raised {type(exc).__name__}: {exc}"
        self._finish(batch)
        return not closing

    def _build_and_score(self, groups: Sequence[StartedGroup]) -> None:
        """Each group's samples in index order (FAILED where the engine raised), the others scored; a group with a
        greedy request: its sample scored with them, its reward set as their reward_baseline, and not kept."""
        baselines: list[Sample | None] = []
        for g in groups:
            g.samples = [sample_of(self._ctx, g.prompt_ids, g.ticket, i, r) for i, r in enumerate(g.requests)]
            baselines.append(None if g.greedy is None else greedy_sample(self._ctx, g.prompt_ids, g.ticket, g.greedy))
        self._ctx.score_groups([(g.prompt, g.samples + ([b] if b is not None else []))     # FAILED and ABORTED
                                for g, b in zip(groups, baselines, strict=True)])          # left as they are
        for g, b in zip(groups, baselines, strict=True):
            if b is not None:
                set_baseline(g.samples, b)
