"""Sessions an external agent has finished and rewarded (`POST /v1/sessions/<id>/reward`), waiting to become a group.

An agent outside the run (its own process, its own harness) drives sessions on the OpenAI endpoint and, when an
episode ends, posts the session's reward. The session leaves the session store (only the key that opened it may do
that) and waits here until the replica's rollout function `external_sessions`
(rlfleet/services/rollout/external_sessions.py) takes a whole group for a ticket the buffer issued, turns each into
a Sample (the session's TITO ids, logprobs and weight versions) and puts them like any other group: the buffer's
staleness bound and the run's identities apply unchanged.

Groups: a reward may name a `group` key; sessions with the same key fill a group together (GRPO compares their
rewards, so give one key to episodes of one task). Sessions without a key fill groups in the order their rewards
arrived. A group is rollout.group_size sessions.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rlfleet.services.rollout.tito import TitoSession

MAX_WAITING = 4096          # rewarded sessions held at most; beyond that a reward is refused (HTTP 503)
MAX_GROUP_KEY = 200         # characters


class TooManyWaiting(RuntimeError):
    """More rewarded sessions wait than the replica holds (the run does not take them as fast as they come)."""


@dataclass(frozen=True)
class RewardedSession:
    session_id: str
    session: TitoSession
    reward: float
    group: str | None = None


class RewardedSessions:
    """Thread-safe: HTTP threads `put`, the rollout function's threads `take_group`."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._max = max_waiting
        self._cond = threading.Condition()
        self._keyed: OrderedDict[str, list[RewardedSession]] = OrderedDict()
        self._loose: list[RewardedSession] = []

    def __len__(self) -> int:
        with self._cond:
            return len(self._loose) + sum(len(v) for v in self._keyed.values())

    def put(self, item: RewardedSession) -> int:
        """Hold `item` until a group takes it; returns how many wait now. TooManyWaiting when full."""
        with self._cond:
            waiting = len(self._loose) + sum(len(v) for v in self._keyed.values())
            if waiting >= self._max:
                raise TooManyWaiting(f"{waiting} rewarded sessions wait for the run to take them")
            if item.group is None:
                self._loose.append(item)
            else:
                self._keyed.setdefault(item.group, []).append(item)
            self._cond.notify_all()
            return waiting + 1

    def take_group(self, size: int, timeout: float) -> list[RewardedSession] | None:
        """`size` sessions of one group key (the oldest complete key first), else `size` sessions without a key in
        arrival order; None when neither is there within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                group = self._ready(size)
                if group is not None:
                    return group
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def _ready(self, size: int) -> list[RewardedSession] | None:
        for key, items in self._keyed.items():
            if len(items) >= size:
                out, rest = items[:size], items[size:]
                if rest:
                    self._keyed[key] = rest
                else:
                    del self._keyed[key]
                return out
        if len(self._loose) >= size:
            out, self._loose = self._loose[:size], self._loose[size:]
            return out
        return None
