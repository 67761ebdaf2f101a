"""Health that means serving: a replica's gRPC health follows its engine, and a replica whose engine stops
answering gives up so that it is replaced (the launcher restarts it; on Kubernetes the container restarts).

Every `interval` seconds the watcher asks `engine.healthy()`; after `failures` answers of False in a row (a check
that raises counts as False) it marks the replica NOT_SERVING and calls `on_unhealthy` once with the reason. The
groups the replica held are not lost: a restarted replica's first Claim hands them back to the buffer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.runtime.exit_codes import GAVE_UP
from rlfleet.services.rollout.engines.base import Engine

log = logging.getLogger(__name__)

ENGINE_UNHEALTHY_EXIT = GAVE_UP      # the replica's exit code when it gave up on its engine


@dataclass(frozen=True)
class WatchSettings:
    interval: float = 2.0      # seconds between checks
    failures: int = 3          # consecutive failed checks before the replica gives up


class EngineWatch:
    """A daemon thread that watches one engine until `stop` is set or the engine is declared unhealthy."""

    def __init__(self, engine: Engine, settings: WatchSettings, set_serving: Callable[[bool], None],
                 on_unhealthy: Callable[[str], None], stop: threading.Event) -> None:
        self.engine, self.settings = engine, settings
        self._set_serving, self._on_unhealthy, self._stop = set_serving, on_unhealthy, stop
        self.failed_since: float | None = None      # monotonic time of the first failed check in the current run
        self._thread = threading.Thread(target=self._loop, name="engine-watch", daemon=True)

    def start(self) -> EngineWatch:
        self._thread.start()
        return self

    def _check(self) -> str | None:
        try:
            return None if self.engine.healthy() else f"engine {self.engine.name!r} reports unhealthy"
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
            return f"engine {self.engine.name!r} health check failed: {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        misses = 0
        while not self._stop.wait(self.settings.interval):
            reason = self._check()
            if reason is None:
                misses, self.failed_since = 0, None
                continue
            misses += 1
            if self.failed_since is None:
                self.failed_since = time.monotonic()
            log.warning("%s (%d of %d)", reason, misses, self.settings.failures)
            if misses >= self.settings.failures:
                self._set_serving(False)
                self._on_unhealthy(reason)
                return
