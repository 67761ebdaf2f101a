"""Where the buffer's state lives. A store persists mutations durably and rebuilds the State on start.

The buffer is the single writer of its store: under its lock it computes mutations, calls append (written), then
applies them to its in-memory State; after releasing the lock, and before replying, it calls sync (durable), so
concurrent calls share one fsync (group commit). After a failed append or sync the buffer reloads the State from
the store, so memory never runs ahead of what the store holds.
"""

from __future__ import annotations

from typing import Protocol

from rlfleet.services.buffer.mutations import Mutation
from rlfleet.services.buffer.state import State


class StoreError(RuntimeError):
    """The store could not persist or read (disk full, Redis down). The operation may be retried."""


class Superseded(StoreError):
    """Another buffer took over this store (a newer writer epoch): this one must stop writing and exit."""


class Store(Protocol):
    def load(self) -> State: ...

    def append(self, mutations: list[Mutation], state: State) -> int:
        """Write one commit, all of it or nothing (state: before it is applied); returns a token for sync."""
        ...

    def sync(self, token: int) -> None:
        """Block until every commit up to token is durable. Thread-safe; called without the buffer's lock."""
        ...

    def commit(self, mutations: list[Mutation], state: State) -> None:
        """append + sync."""
        ...

    def healthy(self) -> bool:
        """False while the last write failed (a failing disk, an unreachable Redis)."""
        ...

    def probe(self) -> bool:
        """When unhealthy, try a harmless write; True once the store works again. Serialized with append."""
        ...

    def close(self) -> None: ...
